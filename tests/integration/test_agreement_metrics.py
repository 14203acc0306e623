"""Rollout/trainer agreement on every in-process GRPO and PPO metrics line (issue #33).

One-cycle CPU runs of the tiny model in fp32 with plain sampling: the engines' sampled log-probs and the
trainer's own forward are the same float32 math on the same weights, so the recorded agreement is (near) zero
and no token leaves [0.9, 1.1]. ``ShiftedLogprobBackend``, a named test double, samples in process but
reports every other token's log-prob ``log(1.2)`` too low: the metrics must then show exactly half the tokens
outside the band, which they can only do if they are measured from the sampled log-probs against the trainer's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from miniverl.rollout import backends
from miniverl.rollout.agreement import (
    MISMATCH_MEAN_ABS_DIFF,
    MISMATCH_OUTSIDE_FRACTION,
    MISMATCH_TOKENS,
    OLD_LOGP_MAX_ABS_DIFF,
)
from miniverl.rollout.backends import InProcessBackend
from tests.conftest import CliResult, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHIFT = math.log(1.2)
#: fp32 CPU: the engine's and the trainer's log-prob of one token differ only by summation order
FP32_CPU_MAX_ABS_DIFF = 1e-4


class ShiftedLogprobBackend(InProcessBackend):
    """In process, but every other sampled token's log-prob reported ``log(1.2)`` lower than the engine's."""

    name = "shifted-test-double"

    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        sampled = super().generate(model, tokenizer, prompts, **sampling)
        return [
            dataclasses.replace(
                t, sampled_logprobs=tuple(lp - SHIFT if k % 2 else lp for k, lp in enumerate(t.sampled_logprobs))
            )
            for t in sampled
        ]


def _one_cycle(
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    model_dir: Path,
    algorithm: str,
    engine: str,
    passes: int = 1,
) -> dict[str, Any]:
    from miniverl.rollout.engine import release_engines

    release_engines()
    config = tiny_config(model_dir, algorithm=algorithm)
    config["train"].update({"cycles": 1})
    if passes > 1:  # old_logp from its own forward before the passes, not from the loss's
        config["algorithm"]["grpo"] = {"ppo_epochs": passes}
    config["rollout"].update({"engine": engine, "temperature": 1.0, "top_p": 1.0, "top_k": 0})
    write_config(config)
    planned = cli("plan", "config.yaml", "--out", "plan.json", "-q")
    assert planned.code == 0, planned.err
    result = cli("run", "--plan", "plan.json", "--run-id", "r", "--threads", "1", "-q")
    assert result.code == 0, result.err
    (line,) = [json.loads(x) for x in Path("runs/r/metrics.jsonl").read_text().splitlines()]
    assert isinstance(line, dict)
    return line


@pytest.mark.parametrize(
    ("algorithm", "engine", "passes"), [("grpo", "fast", 1), ("grpo", "hf", 1), ("grpo", "fast", 2), ("ppo", "fast", 1)]
)
def test_fp32_cpu_runs_record_near_zero_mismatch(
    algorithm: str,
    engine: str,
    passes: int,
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
) -> None:
    line = _one_cycle(cli, write_config, tiny_model_dir, algorithm, engine, passes)
    metrics = line["algorithm_metrics"]
    assert line["rollout_backend"] == engine
    assert metrics[MISMATCH_TOKENS] == line["response_tokens"] > 0
    assert metrics[MISMATCH_OUTSIDE_FRACTION] == 0.0
    assert 0.0 <= metrics[MISMATCH_MEAN_ABS_DIFF] <= metrics[OLD_LOGP_MAX_ABS_DIFF] < FP32_CPU_MAX_ABS_DIFF


def test_the_agreement_is_measured_from_the_sampled_logprobs(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(backends.BACKENDS, "hf", ShiftedLogprobBackend)
    line = _one_cycle(cli, write_config, tiny_model_dir, "grpo", "hf")
    metrics = line["algorithm_metrics"]
    trajectories = [json.loads(x) for x in Path("runs/r/trajectories/cycle-000001.jsonl").read_text().splitlines()]
    shifted = sum(len(t["response_token_ids"]) // 2 for t in trajectories)
    assert metrics[MISMATCH_TOKENS] == line["response_tokens"]
    assert metrics[MISMATCH_OUTSIDE_FRACTION] == pytest.approx(shifted / line["response_tokens"])
    assert metrics[OLD_LOGP_MAX_ABS_DIFF] == pytest.approx(SHIFT, abs=FP32_CPU_MAX_ABS_DIFF)
    assert metrics[MISMATCH_MEAN_ABS_DIFF] == pytest.approx(
        SHIFT * shifted / line["response_tokens"], abs=FP32_CPU_MAX_ABS_DIFF
    )
