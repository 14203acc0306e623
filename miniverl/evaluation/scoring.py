"""Generate on held-out prompts, score with a run's rewards, and summarize (no model loading here).

A summary is ``{"trajectories", "prompts", "reward_mean", "response_tokens_mean", "components"}``
where ``components[name] = {"mean", "fraction_positive"}``; ``fraction_positive`` (the share of
responses whose component is > 0, an accuracy for a 0/1 reward) is given only when every observed
value of that component is 0 or 1, else it is ``None``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniverl.data import PromptRow
from miniverl.rewards import RewardScore
from miniverl.rollout.hf import Trajectory

Summary = dict[str, Any]


@dataclass(frozen=True)
class Decoding:
    """How to generate: ``samples`` responses per prompt at ``temperature`` (0: greedy, one sample)."""

    samples: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    batch_size: int
    seed: int
    use_chat_template: bool

    @classmethod
    def greedy_of(cls, rollout: Any, seed: int) -> Decoding:
        """Greedy decoding with the lengths and batch size of a config's ``rollout`` section."""
        return cls(1, 0.0, 1.0, 0, rollout.max_new_tokens, rollout.batch_size, seed, rollout.use_chat_template)


def generate(model: Any, tokenizer: Any, rows: Sequence[PromptRow], decoding: Decoding, *, version: int) -> list[Any]:
    """``decoding.samples`` responses per row through :func:`miniverl.rollout.hf.generate_group`.

    The fast engine cached for ``model`` is shared with training: its fold is keyed by the adapter
    state and parameter versions, so a base pass (adapter disabled) and a trained pass refold."""
    from miniverl.rollout.hf import generate_group

    return generate_group(
        model,
        tokenizer,
        rows,
        samples_per_prompt=decoding.samples,
        max_new_tokens=decoding.max_new_tokens,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        top_k=decoding.top_k,
        seed=decoding.seed,
        policy_version=version,
        batch_size=decoding.batch_size,
        use_chat_template=decoding.use_chat_template,
    )


def summarize(trajectories: Sequence[Trajectory], scores: Sequence[RewardScore]) -> Summary:
    names = sorted({name for score in scores for name in score.components})
    components: dict[str, dict[str, float | None]] = {}
    for name in names:
        values = [score.components.get(name, 0.0) for score in scores]
        binary = all(v in (0.0, 1.0) for v in values)
        components[name] = {
            "mean": statistics.fmean(values),
            "fraction_positive": sum(v > 0 for v in values) / len(values) if binary else None,
        }
    return {
        "trajectories": len(trajectories),
        "prompts": len({t.prompt_id for t in trajectories}),
        "reward_mean": statistics.fmean(s.total for s in scores) if scores else None,
        "response_tokens_mean": (
            statistics.fmean(t.response_token_count for t in trajectories) if trajectories else None
        ),
        "components": components,
    }


def difference(base: Summary, trained: Summary) -> Summary:
    """``trained - base`` for every number both summaries have (``None`` where either lacks it)."""

    def minus(a: Any, b: Any) -> float | None:
        return None if a is None or b is None else float(b) - float(a)

    components = {
        name: {
            key: minus(base["components"].get(name, {}).get(key), value)
            for key, value in trained["components"][name].items()
        }
        for name in trained["components"]
    }
    return {
        "reward_mean": minus(base["reward_mean"], trained["reward_mean"]),
        "response_tokens_mean": minus(base["response_tokens_mean"], trained["response_tokens_mean"]),
        "components": components,
    }


def flat_metrics(summary: Summary, prefix: str) -> dict[str, float]:
    """``{prefix + "reward_mean": ..., prefix + "<component>/mean": ...}`` (numbers only)."""
    out: dict[str, float] = {}
    for key in ("reward_mean", "response_tokens_mean"):
        if summary[key] is not None:
            out[prefix + key] = float(summary[key])
    for name, values in summary["components"].items():
        for key, value in values.items():
            if value is not None:
                out[f"{prefix}{name}/{key}"] = float(value)
    return out


EvalHook = Callable[[Any, Any, int], dict[str, float]]


def periodic_evaluator(config: Any, plan: Any) -> EvalHook | None:
    """``algorithm.eval_every``: a hook ``(runtime, reward, step) -> metrics`` that, every k updates,
    decodes ``plan.eval_data`` greedily with the current adapter and returns ``eval/...`` metrics
    (``{}`` on other steps). ``None`` when evaluation is off."""
    every = config.algorithm.eval_every
    if every is None or plan.eval_data is None:
        return None
    from miniverl.data import load_prompts

    rows = load_prompts(plan.eval_data.path, config.data.columns)
    decoding = Decoding.greedy_of(config.rollout, config.run.seed)

    def evaluate(runtime: Any, reward: Any, step: int) -> dict[str, float]:
        if step % every:
            return {}
        from miniverl import progress

        progress.phase("eval", f"greedy on {len(rows)} held-out prompts")
        with runtime.generation_model() as model:
            trajectories = generate(model, runtime.tokenizer, rows, decoding, version=step)
        return flat_metrics(summarize(trajectories, reward.score_batch(rows, trajectories)), "eval/")

    return evaluate
