"""What a bundle's ``reward_fn.py`` calls: miniverl's own reward code in verl's signature.

verl's ``custom_reward_function`` is ``compute_score(data_source, solution_str, ground_truth,
extra_info=None) -> float``. The bundle's file holds the reward terms (names, weights, params)
and forwards here; this module builds the same :class:`~miniverl.rewards.CompositeReward` that
a miniverl run uses and gives it the same per-sample ``meta``:

- ``answer`` = ``ground_truth``; ``prompt``, ``prompt_id``, ``context``, ``task`` from ``extra_info``;
- ``response_token_count``: verl passes decoded text, so the count is re-tokenized with the
  actor's tokenizer (``MINIVERL_HANDOFF_TOKENIZER``, set by ``launch.sh``), EOS excluded. This is
  the named deviation ``response_token_count_retokenized``.
- the reward-model role (``reward_model``): miniverl's own :class:`~miniverl.rewards.reward_model.RewardModel`
  (the plan's spec, its identity checked on load, on the CPU) scores ``template`` over the prompt
  and the response, weighted and added to the rule total as in a miniverl run. verl calls this once
  per response, so each text is scored alone (named deviation ``reward_model_unbatched``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from miniverl.errors import UsageError
from miniverl.rewards import CompositeReward

TOKENIZER_ENV = "MINIVERL_HANDOFF_TOKENIZER"

Term = Mapping[str, Any]


def build_reward(terms: Sequence[Term]) -> CompositeReward:
    """The composite reward of the bundle's terms (names and params checked now)."""
    return CompositeReward([(str(t["name"]), float(t["weight"]), dict(t.get("params", {}))) for t in terms])


@cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def count_tokens(text: str) -> int:
    path = os.environ.get(TOKENIZER_ENV)
    if not path:
        raise UsageError(
            f"a reward needs response_token_count: set {TOKENIZER_ENV} to the actor's model directory "
            "(launch.sh does this)"
        )
    return len(_tokenizer(path).encode(text, add_special_tokens=False))


def score(
    terms: Sequence[Term],
    needs_token_count: bool,
    data_source: str,
    solution_str: str,
    ground_truth: str | None,
    extra_info: Mapping[str, Any] | None,
    reward_model: Mapping[str, Any] | None = None,
) -> float:
    info = dict(extra_info or {})
    meta = {
        "answer": "" if ground_truth is None else str(ground_truth),
        "context": str(info.get("context", "")),
        "task": str(info.get("task", data_source.removeprefix("miniverl/"))),
        "prompt_id": str(info.get("prompt_id", "")),
        "response_token_count": count_tokens(solution_str) if needs_token_count else 0,
    }
    prompt = str(info.get("prompt", ""))
    total = _cached(tuple(_freeze(t) for t in terms))(prompt, solution_str, **meta) if terms else 0.0
    if reward_model is not None:
        rm = load_reward_model(json.dumps(dict(reward_model), sort_keys=True))
        text = rm.spec.template.format(prompt=prompt, response=solution_str)
        total += float(reward_model["weight"]) * rm.scores([text])[0]
    return total


@cache
def load_reward_model(frozen: str) -> Any:
    """miniverl's RewardModel for a bundle's ``REWARD_MODEL`` (spec, identity, weight) on the CPU."""
    from miniverl.config.schema import RewardModelSpec
    from miniverl.rewards.reward_model import RewardModel

    data = json.loads(frozen)
    spec = RewardModelSpec.model_validate(data["spec"])
    tokenizer = None
    if spec.source == "tiny":  # the seeded classifier is built on the actor's tokenizer
        path = os.environ.get(TOKENIZER_ENV)
        if not path:
            raise UsageError(
                f"the tiny reward model is built on the actor's tokenizer: set {TOKENIZER_ENV} to the actor's "
                "model directory (launch.sh does this)"
            )
        tokenizer = _tokenizer(path)
    return RewardModel(spec, device="cpu", student_tokenizer=tokenizer, expected_identity=data["identity"])


def _freeze(term: Term) -> tuple[str, float, tuple[tuple[str, Any], ...]]:
    return (str(term["name"]), float(term["weight"]), tuple(sorted(dict(term.get("params", {})).items())))


@cache
def _cached(frozen: tuple[tuple[str, float, tuple[tuple[str, Any], ...]], ...]) -> CompositeReward:
    return CompositeReward([(name, weight, dict(params)) for name, weight, params in frozen])
