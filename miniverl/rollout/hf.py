"""Rollout entry point :func:`generate_group`, and the HF generation backend (a hand-written decode loop).

``generate_group`` runs the fast engine (:mod:`miniverl.rollout.engine`) whenever it supports the
model (``engine="auto"``) and this loop otherwise (or with ``engine="hf"``). The rest of this
docstring describes the loop.

Why not ``model.generate``: the loop below is short, gives each sample its own random stream
(so a sample does not depend on what else is in its batch), and records the log-prob of each
sampled token under the exact distribution it was drawn from (see :mod:`miniverl.rollout.sampling`).

Per batch of rows (a row is one ``(prompt, sample_index)``)::

    left-pad the prompt ids; attention_mask = 1 on real tokens
    position_ids = cumsum(attention_mask) - 1            (pads get 1; they are masked anyway)
    prefill: one forward over the padded prompts, keep only the last position's logits
    repeat up to max_new_tokens times:
        draw a token per unfinished row (its own torch.Generator), record its log-prob
        a row finishes when it emits an EOS id ("eos") or reaches max_new_tokens ("length")
        feed the drawn tokens (a pad for finished rows) at position last + 1, reusing the cache

Left padding plus explicit position ids make each row's computation the same as if it were
alone: pads are masked out of attention and real tokens keep positions 0, 1, 2, ...
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from miniverl.errors import UsageError
from miniverl.rollout.sampling import derive_sample_seed, inverse_cdf_draw, sampling_logprobs

FinishReason = Literal["eos", "length"]
Engine = Literal["auto", "fast", "hf"]


class PromptLike(Protocol):
    """Anything with a ``prompt_id`` and a ``prompt`` (a :class:`PromptInput` or a ``PromptRow``)."""

    @property
    def prompt_id(self) -> str: ...

    @property
    def prompt(self) -> str: ...


@dataclass
class RolloutReport:
    """What one :func:`generate_group` call actually did (filled in by the call).

    ``backend``: ``"fast"`` or ``"hf"``, the path that generated the samples. ``policy_digest``:
    :func:`~miniverl.rollout.weights.policy_digest` of the ``policy_tensors`` the call was given,
    as the rollout used them: for the fast engine, of the snapshot its fold was made from (taken at
    fold time; a reused fold reports its older snapshot); for the hf loop, of the live tensors at
    rollout start. ``None`` when no ``policy_tensors`` were given.
    """

    backend: Literal["fast", "hf", "vllm"] | None = None
    policy_digest: str | None = None


@dataclass(frozen=True)
class PromptInput:
    prompt_id: str
    prompt: str


@dataclass(frozen=True)
class Trajectory:
    """One sampled response and everything needed to score and train on it.

    ``response_token_ids`` includes the EOS token when one was emitted (``finish_reason == "eos"``)
    and nothing after it; ``sampled_logprobs`` has one entry per response token. ``seed`` is the
    derived per-sample seed (:func:`derive_sample_seed`). ``prompt_text`` is the user prompt as
    given (before any chat template); ``response_text`` is decoded without special tokens.
    """

    prompt_id: str
    sample_index: int
    group_id: str
    policy_version: int
    seed: int
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    sampled_logprobs: tuple[float, ...]
    finish_reason: FinishReason
    prompt_text: str
    response_text: str
    #: set by a backend other than the in-process engines (``"vllm"``), with its engine's version
    rollout_backend: str | None = None
    rollout_backend_version: str | None = None
    #: the trainer's recomputed log-prob of each response token (filled in for a foreign backend's samples)
    old_logprobs: tuple[float, ...] | None = None

    @property
    def response_token_count(self) -> int:
        """Generated tokens, not counting a terminating EOS (what length rewards measure)."""
        return len(self.response_token_ids) - (1 if self.finish_reason == "eos" else 0)


def group_id_for(prompt_id: str, policy_version: int) -> str:
    """The GRPO group of a prompt's samples: one group per prompt per policy version."""
    return f"{prompt_id}@v{policy_version}"


def encode_prompt(tokenizer: Any, text: str, *, use_chat_template: bool = True) -> list[int]:
    """Token ids of a prompt: rendered through the chat template (user message, generation
    prompt added) when the tokenizer has one and ``use_chat_template``; else plain encoding
    with the tokenizer's own special tokens (e.g. BOS)."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in ids]
    if not ids:
        raise UsageError(f"prompt {text[:40]!r} encodes to no tokens; prompts must be non-empty")
    return ids


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def resolve_eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a response: the tokenizer's eos id, plus the model config's and the
    generation config's ``eos_token_id`` (int or list). Some tokenizers misreport their EOS
    (SmolLM2's GGUF one says ``<|im_start|>``), so the model's configured ids must count too."""
    ids = _as_id_list(getattr(tokenizer, "eos_token_id", None))
    for holder in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        ids += _as_id_list(getattr(holder, "eos_token_id", None))
    return sorted(set(ids))


def resolve_pad_id(tokenizer: Any, eos_ids: Sequence[int]) -> int:
    """The id fed at padded positions: the tokenizer's pad id, else the first EOS id, else 0.
    Its value never matters (padding is masked out of attention), only that it is a valid id."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        return int(pad)
    return int(eos_ids[0]) if eos_ids else 0


@contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    was_training = bool(model.training)
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def _check_args(samples_per_prompt: int, max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                batch_size: int) -> None:  # fmt: skip
    if samples_per_prompt < 1:
        raise UsageError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0.0:
        raise UsageError(f"temperature must be >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise UsageError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise UsageError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")


@dataclass
class _Row:
    prompt_id: str
    prompt_text: str
    sample_index: int
    seed: int
    prompt_ids: list[int]


def generate_group(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[PromptLike],
    *,
    samples_per_prompt: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    policy_version: int = 0,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    use_chat_template: bool = True,
    eos_token_ids: Sequence[int] | None = None,
    engine: Engine = "auto",
    rollout_dtype: torch.dtype | None = None,
    check_every: int = 8,
    compile_glue: bool = False,
    policy_tensors: Mapping[str, torch.Tensor] | None = None,
    report: RolloutReport | None = None,
) -> list[Trajectory]:
    """Sample ``samples_per_prompt`` responses for each prompt; returned in (prompt, sample) order.

    Sample ``j`` of prompt ``p`` draws from its own generator seeded with
    ``derive_sample_seed(seed, policy_version, p.prompt_id, j)``, one uniform per token, so it is
    the same whatever else shares its batch of ``batch_size`` rows. ``eos_token_ids`` overrides
    :func:`resolve_eos_ids`. The model is put in eval mode under ``torch.no_grad()`` and its
    previous training mode is restored afterwards. ``device`` defaults to the model's device.

    ``engine``: ``"fast"`` is :mod:`miniverl.rollout.engine` (folded policy copy, static cache,
    CUDA graphs on CUDA, counter-based uniforms ``uniform(seed, n)`` per sample); ``"hf"`` the
    transformers decode loop below (one ``torch.Generator`` per sample); ``"auto"`` the fast engine
    when it supports the model, else ``"hf"``. Both sample the same distribution but draw different
    uniforms. ``rollout_dtype`` (fast engine) defaults to bf16 on CUDA and the model's dtype on CPU;
    ``check_every`` is how many decode steps pass between two "all rows finished?" host checks;
    ``compile_glue`` (fast engine, CUDA) fuses the element-wise glue of a decode step with
    ``torch.compile`` (about 1.2-1.3x faster decode on the H200, a one-off compile of seconds).

    ``report`` (a :class:`RolloutReport`) is filled with the backend used and, given
    ``policy_tensors`` (the trainable adapter tensors by name), the digest of the policy the
    rollout actually sampled from.
    """
    _check_args(samples_per_prompt, max_new_tokens, temperature, top_p, top_k, batch_size)
    ids_seen = [p.prompt_id for p in prompts]
    if len(set(ids_seen)) != len(ids_seen):
        raise UsageError("generate_group: prompt_ids must be unique within one call")
    target = torch.device(device) if device is not None else next(model.parameters()).device
    eos_ids = sorted(set(eos_token_ids)) if eos_token_ids is not None else resolve_eos_ids(model, tokenizer)
    if not eos_ids:
        raise UsageError("no EOS token id: neither the tokenizer nor the model config defines one")
    pad_id = resolve_pad_id(tokenizer, eos_ids)

    rows: list[_Row] = []
    for prompt in prompts:
        prompt_ids = encode_prompt(tokenizer, prompt.prompt, use_chat_template=use_chat_template)
        for sample_index in range(samples_per_prompt):
            sample_seed = derive_sample_seed(seed, policy_version, prompt.prompt_id, sample_index)
            rows.append(_Row(prompt.prompt_id, prompt.prompt, sample_index, sample_seed, prompt_ids))

    if engine not in ("auto", "fast", "hf"):
        raise UsageError(f"engine must be auto, fast or hf, got {engine!r}")
    if check_every < 1:
        raise UsageError(f"check_every must be >= 1, got {check_every}")
    use_fast = False
    if engine != "hf":
        from miniverl.rollout.weights import unsupported_reason

        reason = unsupported_reason(model)
        if reason is not None and engine == "fast":
            raise UsageError(f"the fast rollout engine cannot run this model: {reason}; use engine 'hf'")
        use_fast = reason is None

    out: list[Trajectory] = []
    digest: str | None = None
    with _eval_mode(model):
        if use_fast:
            from miniverl.rollout.decoder import SamplingSpec
            from miniverl.rollout.engine import EngineRow, engine_for

            fast = engine_for(model, target, rollout_dtype, compile_glue=compile_glue)
            digest = fast.sync_policy(model, policy_version, policy_tensors)
            decoded = fast.generate(
                [EngineRow(r.prompt_ids, r.seed) for r in rows],
                batch_size=batch_size,
                max_new_tokens=max_new_tokens,
                spec=SamplingSpec(temperature, top_p, top_k, eos_ids),
                pad_id=pad_id,
                check_every=check_every,
            )
        else:
            if policy_tensors is not None:
                from miniverl.rollout.weights import policy_digest

                digest = policy_digest(policy_tensors)
            decoded = []
            for start in range(0, len(rows), batch_size):
                batch = rows[start : start + batch_size]
                decoded += _decode_batch(
                    model, batch, eos_ids, pad_id, target, max_new_tokens, temperature, top_p, top_k
                )
        for row, (tokens, logprobs, finish) in zip(rows, decoded, strict=True):
            out.append(
                Trajectory(
                    prompt_id=row.prompt_id,
                    sample_index=row.sample_index,
                    group_id=group_id_for(row.prompt_id, policy_version),
                    policy_version=policy_version,
                    seed=row.seed,
                    prompt_token_ids=tuple(row.prompt_ids),
                    response_token_ids=tuple(tokens),
                    sampled_logprobs=tuple(logprobs),
                    finish_reason=finish,
                    prompt_text=row.prompt_text,
                    response_text=tokenizer.decode(tokens, skip_special_tokens=True),
                )
            )
    if report is not None:
        report.backend = "fast" if use_fast else "hf"
        report.policy_digest = digest
    return out


def _decode_batch(
    model: Any,
    batch: list[_Row],
    eos_ids: list[int],
    pad_id: int,
    device: torch.device,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
) -> list[tuple[list[int], list[float], FinishReason]]:
    size = len(batch)
    width = max(len(r.prompt_ids) for r in batch)
    input_ids = torch.full((size, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((size, width), dtype=torch.long)
    for i, row in enumerate(batch):
        input_ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids, dtype=torch.long)
        attention_mask[i, width - len(row.prompt_ids) :] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    generators = [torch.Generator(device="cpu").manual_seed(r.seed) for r in batch]
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)

    tokens: list[list[int]] = [[] for _ in batch]
    logprobs: list[list[float]] = [[] for _ in batch]
    finish: list[FinishReason] = ["length"] * size
    finished = torch.zeros(size, dtype=torch.bool, device=device)

    outputs = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
    )
    next_position = position_ids[:, -1:] + 1
    for step in range(max_new_tokens):
        logits = outputs.logits[:, -1, :]
        if temperature == 0.0:
            chosen = torch.argmax(logits, dim=-1)
            chosen_logprobs = torch.zeros(size, dtype=torch.float32, device=device)
        else:
            row_logprobs = sampling_logprobs(logits, temperature=temperature, top_p=top_p, top_k=top_k)
            # One uniform per row per step, always drawn, so a row's stream never depends on others.
            uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators])
            chosen = inverse_cdf_draw(row_logprobs, uniforms)
            chosen_logprobs = row_logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
        chosen = chosen.masked_fill(finished, pad_id)
        is_eos = torch.isin(chosen, eos) & ~finished
        for i, (token, logprob, done, hit_eos) in enumerate(
            zip(chosen.tolist(), chosen_logprobs.tolist(), finished.tolist(), is_eos.tolist(), strict=True)
        ):
            if done:
                continue
            tokens[i].append(token)
            logprobs[i].append(logprob)
            if hit_eos:
                finish[i] = "eos"
        finished |= is_eos
        if bool(finished.all()) or step == max_new_tokens - 1:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((size, 1))], dim=-1)
        outputs = model(
            input_ids=chosen.unsqueeze(-1),
            attention_mask=attention_mask,
            position_ids=next_position,
            past_key_values=outputs.past_key_values,
            use_cache=True,
        )
        next_position = next_position + 1
    return list(zip(tokens, logprobs, finish, strict=True))
