"""The reward-model role: a sequence classifier scoring whole trajectories, mixed with rule rewards.

``models.reward`` names an ``AutoModelForSequenceClassification`` (hub at a 40-hex commit, a local
directory, or a tiny seeded Llama classifier for tests). Its content identity is pinned in the plan
and re-checked when it is loaded. Scores are the logit at ``label`` of ``template`` texts, computed
in fixed batches in trajectory order under ``no_grad`` in fp32 (deterministic on CPU).
With ``placement: offload`` the model lives on the CPU and visits the device only for its phase.

:class:`MixedReward` adds the weighted ``reward_model`` term to the rule rewards of
``algorithm.rewards`` (a :class:`~miniverl.rewards.base.CompositeReward`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from miniverl.canonical import sha256_json
from miniverl.config.schema import REWARD_MODEL_TERM, ModelSpec, RewardModelSpec, RewardTerm
from miniverl.errors import ConfigError
from miniverl.rewards.base import CompositeReward, RewardScore, reward_meta

__all__ = ["MixedReward", "RewardModel", "reward_model_identity"]


def _as_model_spec(spec: RewardModelSpec) -> ModelSpec:
    return ModelSpec(
        source=spec.source,  # type: ignore[arg-type]  # hub/local only here
        model_id=spec.model_id,
        revision=spec.revision,
        path=spec.path,
        allow_mutable_revision=spec.allow_mutable_revision,
    )


def reward_model_identity(spec: RewardModelSpec, *, fetch: bool = False) -> tuple[dict[str, Any], Path | None]:
    """``(identity, directory)``: content digests only (hub commit, local tree sha256, tiny config digest)."""
    if spec.source == "tiny":
        assert spec.tiny is not None
        tiny = spec.tiny.model_dump(mode="json")
        return {"source": "tiny", "architecture": "llama", "tiny": tiny, "config_sha256": sha256_json(tiny)}, None
    from miniverl.models.sources import resolve

    resolved = resolve(_as_model_spec(spec), fetch=fetch)
    identity = {"role": "sequence_classifier", **resolved.identity}
    return identity, resolved.path


class RewardModel:
    """A loaded sequence classifier with its tokenizer; :meth:`scores` is the batched scoring phase."""

    def __init__(
        self,
        spec: RewardModelSpec,
        *,
        device: Any,
        student_tokenizer: Any,
        expected_identity: dict[str, Any] | None = None,
    ) -> None:
        import torch

        self.spec = spec
        self.device = torch.device(device)
        self.identity, directory = reward_model_identity(spec, fetch=True)
        if expected_identity is not None and self.identity != expected_identity:
            raise ConfigError("models.reward changed since `miniverl plan` (its content digest differs); re-run plan")
        if spec.source == "tiny":
            self.model, self.tokenizer = _tiny_classifier(spec, student_tokenizer)
        else:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            assert directory is not None
            self.model = AutoModelForSequenceClassification.from_pretrained(
                str(directory), dtype=torch.float32, attn_implementation="eager"
            )
            self.tokenizer = AutoTokenizer.from_pretrained(str(directory))
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(self.model.config, "pad_token_id", None) is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if spec.label >= int(self.model.config.num_labels):
            raise ConfigError(
                f"models.reward.label {spec.label} is out of range: the model has "
                f"{self.model.config.num_labels} label(s)"
            )
        self.model.requires_grad_(False).eval()
        self.home = torch.device("cpu") if spec.placement == "offload" else self.device
        self.model.to(self.home)
        self.transfers = 0  # device moves made for scoring phases (offload)

    @property
    def location(self) -> str:
        return str(next(self.model.parameters()).device)

    def nbytes(self, *, on: Any = None) -> int:
        """Bytes of the model's parameters and buffers (only those on device ``on``, when given)."""
        import torch

        where = torch.device(on) if on is not None else None
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(
            t.numel() * t.element_size()
            for t in tensors
            if where is None or (t.device.type == where.type and (where.index is None or t.device.index == where.index))
        )

    @contextmanager
    def _phase(self) -> Any:
        """Bring the model to the device for one scoring phase, and home again afterwards."""
        moved = self.home != self.device
        if moved:
            self.model.to(self.device)
            self.transfers += 1
        try:
            yield
        finally:
            if moved:
                self.model.to(self.home)
                self.transfers += 1
                if self.device.type == "cuda":
                    import torch

                    torch.cuda.empty_cache()

    def scores(self, texts: Sequence[str]) -> list[float]:
        """One float per text: the ``label`` logit, batches of ``batch_size`` in input order."""
        import torch

        out: list[float] = []
        size = self.spec.batch_size
        with self._phase(), torch.no_grad():
            for start in range(0, len(texts), size):
                enc = self.tokenizer(
                    list(texts[start : start + size]),
                    padding=True,
                    truncation=True,
                    max_length=self.spec.max_length,
                    return_tensors="pt",
                ).to(self.device)
                logits = self.model(**enc).logits.float()
                out.extend(float(x) for x in logits[:, self.spec.label].cpu())
        return out

    def close(self) -> None:
        self.model = None


def _tiny_classifier(spec: RewardModelSpec, student_tokenizer: Any) -> tuple[Any, Any]:
    """A seeded Llama sequence classifier over the student's tokenizer; the global RNG is untouched."""
    import torch
    from transformers import LlamaConfig, LlamaForSequenceClassification

    assert spec.tiny is not None
    tokenizer = copy.deepcopy(student_tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tiny = spec.tiny
    fields: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "hidden_size": tiny.hidden_size,
        "num_hidden_layers": tiny.num_hidden_layers,
        "num_attention_heads": tiny.num_attention_heads,
        "num_key_value_heads": tiny.num_attention_heads,
        "intermediate_size": tiny.intermediate_size,
        "max_position_embeddings": max(spec.max_length, 64),
        "num_labels": spec.label + 1,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = LlamaConfig(**fields)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny.seed)
        model = LlamaForSequenceClassification(config)
    model.float()
    return model, tokenizer


class MixedReward:
    """Rule rewards (``CompositeReward``) plus the weighted reward-model term, one ``RewardScore`` each.

    ``total = sum_rules weight_i * rule_i + weight_rm * rm_score``; ``components`` holds every term
    (``reward_model`` included) unweighted, as ``CompositeReward`` does.
    """

    def __init__(self, terms: Sequence[RewardTerm], reward_model: RewardModel | None) -> None:
        rules = [t for t in terms if t.name != REWARD_MODEL_TERM]
        rm_terms = [t for t in terms if t.name == REWARD_MODEL_TERM]
        if rm_terms and reward_model is None:
            raise ConfigError(f"reward {REWARD_MODEL_TERM!r} needs models.reward")
        if len(rm_terms) > 1:
            raise ConfigError(f"reward {REWARD_MODEL_TERM!r} appears twice; list each reward once")
        self.rules = CompositeReward([(t.name, t.weight, t.params) for t in rules]) if rules else None
        self.rm = reward_model if rm_terms else None
        self.rm_weight = rm_terms[0].weight if rm_terms else 0.0

    def score_batch(self, prompts: Sequence[Any], trajectories: Sequence[Any]) -> list[RewardScore]:
        by_id = {row.prompt_id: row for row in prompts}
        out: list[RewardScore] = []
        for traj in trajectories:
            row = by_id[traj.prompt_id]
            if self.rules is None:
                out.append(RewardScore(total=0.0, components={}))
                continue
            meta = reward_meta(row, response_token_count=traj.response_token_count, sample_index=traj.sample_index)
            out.append(self.rules.score(row.prompt, traj.response_text, **meta))
        if self.rm is None:
            return out
        texts = [
            self.rm.spec.template.format(prompt=by_id[t.prompt_id].prompt, response=t.response_text)
            for t in trajectories
        ]
        rm_scores = self.rm.scores(texts)
        return [
            RewardScore(total=s.total + self.rm_weight * r, components={**s.components, REWARD_MODEL_TERM: r})
            for s, r in zip(out, rm_scores, strict=True)
        ]

    def close(self) -> None:
        if self.rm is not None:
            self.rm.close()
