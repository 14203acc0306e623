"""CUDA paths (skipped without CUDA): bf16 and NF4 training, peak memory and teardown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import tiny_config

pytestmark = pytest.mark.gpu

PLUGIN = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]


@pytest.mark.parametrize(
    ("dtype", "quantization", "algorithm"),
    [("bfloat16", "none", "grpo"), ("float32", "nf4", "grpo"), ("bfloat16", "nf4", "opd")],
)
def test_cuda_training_and_teardown(
    cli, write_config, tiny_model_dir, prompts, workdir: Path, dtype, quantization, algorithm
):
    config = tiny_config(tiny_model_dir, algorithm=algorithm)
    config["run"]["deterministic"] = False
    config["models"].update({"device": "cuda", "dtype": dtype})
    config["models"]["student"]["quantization"] = quantization
    if algorithm == "opd":
        config["models"]["teacher"]["quantization"] = quantization
    else:
        config["algorithm"]["rewards"] = PLUGIN
    write_config(config)
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    result = cli("run", "--plan", "plan.json", "--run-id", "gpu", "--json")
    assert result.code == 0, result.err
    summary = result.json()["summary"]
    assert summary["device"] == "cuda"
    assert summary["adapter_changed_each_update"] is True
    cuda = summary["cuda"]
    assert cuda["peak_reserved_bytes"] > 0
    assert cuda["teardown_returned_to_baseline"], cuda
    exported = cli("export", str(workdir / "runs/gpu"), "--out", "adapter", "--json")
    assert exported.code == 0, exported.err
    assert json.loads(exported.out)["reload"]["passed"]
