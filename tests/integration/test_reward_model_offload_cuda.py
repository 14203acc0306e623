"""CUDA (skipped without it): ``models.reward.placement: offload`` against ``resident`` in a short PPO run.

With offload the reward model visits the device only for its scoring phase: its parameters are on the CPU
before and after every scoring call, on the device during it, and each cycle moves it twice. With resident
placement it never leaves the device, so between phases (at the start of the update phase, and at the next
cycle's rollout) the run holds about the reward model's bytes more CUDA memory than the offload run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_config

pytestmark = pytest.mark.gpu

PLUGIN = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]
# about 10.7 M fp32 parameters (~41 MiB): large next to the allocator's rounding and the tiny actor's activations
TINY_RM = {"hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 1024, "seed": 1}
MIB = 2**20


def _run(cli, write_config, model_dir: Path, workdir: Path, placement: str, monkeypatch) -> dict[str, Any]:
    import torch

    from miniverl.rewards.reward_model import RewardModel
    from miniverl.training.entry import run_from_plan

    config = tiny_config(model_dir, algorithm="ppo")
    config["run"]["deterministic"] = False
    config["models"]["device"] = "cuda"
    config["algorithm"]["rewards"] = [*PLUGIN, {"name": "reward_model", "weight": 0.5}]
    config["algorithm"]["ppo"] = {"mini_batches": 1, "ppo_epochs": 1}
    config["models"]["reward"] = {"source": "tiny", "placement": placement, "batch_size": 2, "tiny": TINY_RM}
    write_config(config)
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0

    calls: list[dict[str, Any]] = []
    original = RewardModel.scores

    def observed(self: RewardModel, texts: Any) -> list[float]:
        during: list[str] = []

        def pre_hook(module: Any, args: Any) -> None:
            during.append(str(next(module.parameters()).device))

        before = self.location
        handle = self.model.register_forward_pre_hook(pre_hook)
        try:
            out = original(self, texts)
        finally:
            handle.remove()
        calls.append({"before": before, "during": during, "after": self.location, "bytes": self.nbytes()})
        return out

    monkeypatch.setattr(RewardModel, "scores", observed)
    allocated: dict[tuple[str, int], int] = {}

    def probe(name: str, step: int) -> None:
        allocated[(name, step)] = torch.cuda.memory_allocated()

    result = run_from_plan(Path("plan.json"), output=Path("runs"), run_id=placement, on_phase=probe)
    monkeypatch.setattr(RewardModel, "scores", original)
    lines = [json.loads(x) for x in (workdir / "runs" / placement / "metrics.jsonl").read_text().splitlines()]
    return {"summary": result["summary"], "lines": lines, "calls": calls, "allocated": allocated}


def test_reward_model_offload_leaves_the_device_between_phases(
    cli, write_config, tiny_model_dir, prompts, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offload = _run(cli, write_config, tiny_model_dir, workdir, "offload", monkeypatch)
    resident = _run(cli, write_config, tiny_model_dir, workdir, "resident", monkeypatch)
    rm_bytes = offload["calls"][0]["bytes"]
    assert rm_bytes > 30 * MIB and resident["calls"][0]["bytes"] == rm_bytes

    # offload: on the CPU before and after each scoring phase, on the device for its forwards, 2 moves a cycle
    assert len(offload["calls"]) == 2
    for call in offload["calls"]:
        assert call["before"] == "cpu" and call["after"] == "cpu", call
        assert call["during"] and all(d.startswith("cuda") for d in call["during"]), call
    for cycle, line in enumerate(offload["lines"], start=1):
        m = line["algorithm_metrics"]
        assert m["reward_model/transfers"] == 2 * cycle
        assert m["reward_model/offloaded_after_phase"] == 1.0
        assert m["reward_model/device_bytes_after_phase"] == 0.0
        assert m["reward_model/bytes"] == rm_bytes
    # resident: never moved
    for call in resident["calls"]:
        assert call["before"].startswith("cuda") and call["after"].startswith("cuda"), call
        assert all(d.startswith("cuda") for d in call["during"]), call
    for line in resident["lines"]:
        m = line["algorithm_metrics"]
        assert m["reward_model/transfers"] == 0.0 and m["reward_model/offloaded_after_phase"] == 0.0
        assert m["reward_model/device_bytes_after_phase"] == rm_bytes

    # memory between phases, each run relative to its own baseline: the resident run holds ~ the RM more
    def held(run: dict[str, Any], point: tuple[str, int]) -> int:
        return run["allocated"][point] - run["summary"]["cuda"]["baseline_allocated_bytes"]

    tolerance = 4 * MIB + rm_bytes // 20
    for point in (("update", 0), ("rollout", 1), ("update", 1), ("checkpoint", 1)):
        extra = held(resident, point) - held(offload, point)
        assert abs(extra - rm_bytes) <= tolerance, (point, extra, rm_bytes)
    # the metric the runtime records says the same thing as the probe (same point: just before on_phase)
    for run in (offload, resident):
        for step, line in enumerate(run["lines"]):
            assert line["update_start_allocated_bytes"] == run["allocated"][("update", step)]
    for a, b in zip(offload["lines"], resident["lines"], strict=True):
        assert b["peak_allocated_bytes"] >= a["peak_allocated_bytes"] - MIB  # never lower, up to allocator noise
    for run in (offload, resident):
        assert run["summary"]["cuda"]["teardown_returned_to_baseline"], run["summary"]["cuda"]
