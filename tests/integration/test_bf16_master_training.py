"""train.adapter_precision bf16_master through training: bf16 LoRA tensors in the model, fp32 masters
in the optimizer, the checkpoint and the export; a kill/resume stays tensor-exact (CPU, bfloat16 student)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import tiny_config
from tests.integration.test_training import PLUGIN, _final_tensors, _plan, run_straight_and_cut_after_update_1


def _bf16_config(model_dir: Path, algorithm: str) -> dict:
    config = tiny_config(model_dir, algorithm=algorithm)
    config["models"]["dtype"] = "bfloat16"
    config["train"]["adapter_precision"] = "bf16_master"
    if algorithm in ("grpo", "ppo"):
        config["algorithm"]["rewards"] = PLUGIN
    if algorithm == "ppo":
        config["algorithm"]["ppo"] = {"mini_batches": 1, "ppo_epochs": 1}
    return config


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_bf16_master_kill_resume_is_tensor_exact(
    cli, write_config, tiny_model_dir, prompts, workdir: Path, algorithm: str
) -> None:
    _plan(cli, write_config, _bf16_config(tiny_model_dir, algorithm), "train.cycles=3")
    run_straight_and_cut_after_update_1()
    resumed = cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", "cut", "--resume", "--json")
    assert resumed.code == 0, resumed.err
    params_a, opt_a = _final_tensors(workdir / "runs/straight")
    params_b, opt_b = _final_tensors(workdir / "runs/cut")
    assert params_a.keys() == params_b.keys() and opt_a.keys() == opt_b.keys()
    # the checkpoint holds the fp32 masters, not the model's bf16 rounding of them
    assert all(t.dtype == torch.float32 for t in params_a.values())
    assert any(not t.equal(t.bfloat16().float()) for t in params_a.values())
    assert all(t.dtype == torch.float32 for k, t in opt_a.items() if k.endswith(("exp_avg", "exp_avg_sq")))
    for name in params_a:
        assert params_a[name].equal(params_b[name]), name
    for name in opt_a:
        assert opt_a[name].equal(opt_b[name]), name
    metrics = [json.loads(line) for line in (workdir / "runs/cut/metrics.jsonl").read_text().splitlines()]
    assert [m["algorithm_metrics"]["train/adapter_bf16_master"] for m in metrics] == [1.0, 1.0, 1.0]
    if algorithm == "ppo":
        last = sorted((workdir / "runs/straight/checkpoints").glob("step-*"))[-1]
        critic_a = load_file(last / "critic_params.safetensors")
        critic_b = load_file(
            sorted((workdir / "runs/cut/checkpoints").glob("step-*"))[-1] / "critic_params.safetensors"
        )
        assert all(t.dtype == torch.float32 for t in critic_a.values())
        assert all(critic_a[k].equal(critic_b[k]) for k in critic_a)
        saved = load_file(last / "critic" / "adapter_model.safetensors")
        assert saved and all(t.dtype == torch.float32 for t in saved.values())


def test_checkpoint_adapter_and_export_are_the_masters(
    cli, write_config, tiny_model_dir, prompts, workdir: Path
) -> None:
    config = _bf16_config(tiny_model_dir, "grpo")
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "m", "--json")
    assert result.code == 0, result.err
    last = sorted((workdir / "runs/m/checkpoints").glob("step-*"))[-1]
    masters = load_file(last / "student_params.safetensors")

    def peft_name(name: str) -> str:  # the runtime's parameter name -> PEFT's saved key (no adapter name)
        return name.replace(".student.", ".")

    expected = {peft_name(k): v for k, v in masters.items()}
    in_checkpoint = load_file(last / "adapter" / "adapter_model.safetensors")
    exported = cli("export", str(workdir / "runs/m"), "--out", "adapter", "--json")
    assert exported.code == 0, exported.err
    assert exported.json()["reload"]["passed"]
    in_export = load_file(workdir / "adapter" / "adapter_model.safetensors")
    for saved in (in_checkpoint, in_export):
        assert saved.keys() == expected.keys()
        for key, tensor in saved.items():
            assert tensor.dtype == torch.float32 and tensor.equal(expected[key]), key


def test_fp32_is_the_cpu_default_and_recorded(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir, algorithm="opd")
    config["train"]["cycles"] = 1
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "f", "--json")
    assert result.code == 0, result.err
    line = json.loads((workdir / "runs/f/metrics.jsonl").read_text().splitlines()[0])
    assert line["algorithm_metrics"]["train/adapter_bf16_master"] == 0.0


def test_opd_trains_with_bf16_masters(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = _bf16_config(tiny_model_dir, "opd")
    config["train"]["cycles"] = 1
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "o", "--json")
    assert result.code == 0, result.err
    assert result.json()["summary"]["adapter_changed_each_update"] is True
    params, _ = _final_tensors(workdir / "runs/o")
    assert all(t.dtype == torch.float32 for t in params.values())
