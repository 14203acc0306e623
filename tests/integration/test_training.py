"""End to end on a tiny model, through the CLI entry points: plan, run, inspect, export, resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file

from harness.qualify.full.statehash import optimizer_steps
from tests.conftest import CliResult, tiny_config

PLUGIN = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]


def _plan(cli: Callable[..., CliResult], write_config, config: dict, *overrides: str) -> None:
    write_config(config)
    args = ["plan", "config.yaml", "--out", "plan.json", "--json"]
    for item in overrides:
        args += ["--set", item]
    result = cli(*args)
    assert result.code == 0, result.err


def test_grpo_end_to_end(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    config["rollout"]["samples_per_prompt"] = 4
    _plan(cli, write_config, config)
    assert cli("run", "--plan", "plan.json", "--run-id", "g", "--dry-run", "--json").json()["status"] == "dry_run_ok"
    result = cli("run", "--plan", "plan.json", "--run-id", "g", "--json")
    assert result.code == 0, result.err
    summary = result.json()["summary"]
    assert summary["updates"] == 2
    assert summary["adapter_changed_each_update"] is True
    assert summary["reward_std_within_group_max"] > 0
    assert summary["nonzero_advantages"] > 0
    run_dir = workdir / "runs" / "g"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    trajectories = (run_dir / "trajectories" / "cycle-000001.jsonl").read_text().splitlines()
    first = json.loads(trajectories[0])
    assert len(first["sampled_logprobs"]) == len(first["response_token_ids"])
    assert first["policy_version"] == 0
    report = cli("inspect", str(run_dir), "--json").json()
    assert report["status"] == "completed" and report["last_complete_step"] == 2
    exported = cli("export", str(run_dir), "--out", "adapter", "--json")
    assert exported.code == 0, exported.err
    reload = exported.json()["reload"]
    assert reload["passed"] and reload["max_abs_logit_diff"] <= reload["tolerance"]
    assert (workdir / "adapter" / "adapter_config.json").is_file()
    manifest_text = (workdir / "adapter" / "miniverl-manifest.json").read_text()
    assert str(workdir) not in manifest_text and str(tiny_model_dir) not in manifest_text


def test_opd_privileged_teacher_trains(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    _plan(cli, write_config, tiny_config(tiny_model_dir, algorithm="opd"))
    result = cli("run", "--plan", "plan.json", "--run-id", "o", "--json")
    assert result.code == 0, result.err
    summary = result.json()["summary"]
    assert summary["adapter_changed_each_update"] is True
    metrics = [json.loads(line) for line in (workdir / "runs/o/metrics.jsonl").read_text().splitlines()]
    assert all(m["loss"] > 0 and m["kl"] > 0 for m in metrics)


def _final_tensors(run_dir: Path) -> tuple[dict, dict]:
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    return load_file(last / "student_params.safetensors"), load_file(last / "optimizer.safetensors")


def run_straight_and_cut_after_update_1() -> None:
    """``plan.json`` run to its end as ``runs/straight``, and as ``runs/cut`` stopped right after its first update."""
    from miniverl.training.entry import run_from_plan

    run_from_plan(Path("plan.json"), output=Path("runs"), run_id="straight")

    class Interrupt(Exception):
        pass

    def stop_after_first(step: int) -> None:
        if step == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        run_from_plan(Path("plan.json"), output=Path("runs"), run_id="cut", on_update=stop_after_first)


def test_interrupted_then_resumed_is_bit_identical(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:

    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    _plan(cli, write_config, config, "train.cycles=3")
    run_straight_and_cut_after_update_1()
    assert not (workdir / "runs/cut/summary.json").exists()
    resumed = cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", "cut", "--resume", "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.json()["summary"]["resumed_from_step"] == 1
    params_a, opt_a = _final_tensors(workdir / "runs/straight")
    params_b, opt_b = _final_tensors(workdir / "runs/cut")
    assert params_a.keys() == params_b.keys() and opt_a.keys() == opt_b.keys()
    for name in params_a:
        assert params_a[name].equal(params_b[name]), name
    for name in opt_a:
        assert opt_a[name].equal(opt_b[name]), name
    assert (workdir / "runs/straight/metrics.jsonl").read_text().count("\n") == 3
    # the multi-tensor AdamW keeps torch's per-slot state: the harness still reads one step counter per slot
    last = sorted((workdir / "runs/cut/checkpoints").glob("step-*"))[-1]
    steps = optimizer_steps((last / "optimizer.safetensors").read_bytes(), "optimizer.safetensors")
    assert [(t.value, t.slots) for t in steps.steps] == [(3.0, steps.slots)] and steps.slots == len(params_a)
    groups = json.loads((last / "state.json").read_text())["optimizer"]["param_groups"]
    assert [g["foreach"] for g in groups] == [True]


def test_corrupt_checkpoint_is_refused(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    _plan(cli, write_config, config, "train.cycles=1")
    assert cli("run", "--plan", "plan.json", "--run-id", "c", "--json").code == 0
    victim = next((workdir / "runs/c/checkpoints").glob("step-*")) / "optimizer.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    result = cli("run", "--plan", "plan.json", "--run-id", "c", "--resume")
    assert result.code == 1
    assert "corrupt" in result.err and "optimizer.safetensors" in result.err
    assert "Traceback" not in result.err
    assert cli("inspect", str(workdir / "runs/c"), "--json").json()["checkpoints"][0]["state"] == "corrupt"


@pytest.mark.parametrize("algorithm", ["grpo", "opd", "ppo"])
def test_physical_batching_does_not_change_the_objective(
    cli, write_config, tiny_model_dir, prompts, workdir, algorithm
):
    """One optimizer group run as 4 sequential forwards, as padded pairs and as `auto`: same loss and gradient norm.

    (Parameters after Adam's first step are not compared: that step is lr * sign(grad), which turns
    float noise in a near-zero gradient entry into a full-size difference.)
    """
    seen = {}
    for batch in (1, 2, "auto"):
        config = tiny_config(tiny_model_dir, algorithm=algorithm)
        if algorithm in ("grpo", "ppo"):
            config["algorithm"]["rewards"] = PLUGIN
        if algorithm == "ppo":  # one actor and one critic step: comparable before Adam amplifies noise
            config["algorithm"]["ppo"] = {"mini_batches": 1, "ppo_epochs": 1}
        config["train"].update({"cycles": 1, "trajectory_batch_size": batch})
        _plan(cli, write_config, config)
        result = cli("run", "--plan", "plan.json", "--run-id", f"b{batch}", "--json")
        assert result.code == 0, result.err
        line = json.loads((workdir / "runs" / f"b{batch}" / "metrics.jsonl").read_text().splitlines()[0])
        seen[batch] = (line["loss"], line["grad_norm"], line["response_tokens"])
    for batch in (2, "auto"):
        assert seen[batch][2] == seen[1][2]
        assert seen[batch][0] == pytest.approx(seen[1][0], rel=1e-5, abs=1e-7), batch
        assert seen[batch][1] == pytest.approx(seen[1][1], rel=1e-4), batch


def test_shared_backbone_opd_through_the_cli(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    """The seed's shared-backbone shape: one base, a trainable student, a pinned frozen teacher adapter."""
    from transformers import AutoConfig

    from miniverl.gate.models import write_random_adapter

    sha = write_random_adapter(AutoConfig.from_pretrained(tiny_model_dir), workdir / "teacher-adapter", seed=3, r=4)
    config = tiny_config(tiny_model_dir, algorithm="opd")
    config["models"]["runtime"] = "shared_backbone"
    config["models"]["teacher"] = {
        "source": "student",
        "adapter": {"source": "local", "path": "teacher-adapter", "sha256": sha},
    }
    config["train"]["trajectory_batch_size"] = "auto"
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "shared", "--json")
    assert result.code == 0, result.err
    assert result.json()["summary"]["runtime"] == "shared_backbone"
    assert result.json()["summary"]["adapter_changed_each_update"] is True
    run_json = json.loads((workdir / "runs/shared/run.json").read_text())
    assert sha in json.dumps(run_json["roles"])
    assert str(workdir) not in json.dumps(run_json)
    exported = cli("export", str(workdir / "runs/shared"), "--out", "adapter", "--json")
    assert exported.code == 0, exported.err
    assert exported.json()["reload"]["passed"]


def test_shared_backbone_refuses_a_teacher_adapter_whose_pin_changed(
    cli, write_config, tiny_model_dir, prompts, workdir
):
    from transformers import AutoConfig

    from miniverl.gate.models import write_random_adapter

    write_random_adapter(AutoConfig.from_pretrained(tiny_model_dir), workdir / "teacher-adapter", seed=3, r=4)
    config = tiny_config(tiny_model_dir, algorithm="opd")
    config["models"]["runtime"] = "shared_backbone"
    pin = "0" * 64
    config["models"]["teacher"] = {
        "source": "student",
        "adapter": {"source": "local", "path": "teacher-adapter", "sha256": pin},
    }
    write_config(config)
    result = cli("plan", "config.yaml", "--out", "plan.json")
    if result.code == 0:
        result = cli("run", "--plan", "plan.json", "--run-id", "bad")
    assert result.code != 0
    assert result.err.count("\n") == 1 and "sha256" in result.err and "Traceback" not in result.err
