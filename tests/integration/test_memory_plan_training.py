"""The memory plan applied to a real runtime (CPU: the plan itself; CUDA: a run under the budget)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from miniverl.config.schema import MiniverlConfig
from miniverl.runtime.memory_plan import GIB, DecoderDims, estimate
from tests.conftest import tiny_config
from tests.integration.test_training import PLUGIN, _plan


def _config(model_dir: Path, **train: object) -> MiniverlConfig:
    raw = tiny_config(model_dir, algorithm="grpo")
    raw["algorithm"]["rewards"] = PLUGIN
    raw["rollout"].update({"prompts_per_cycle": 2, "samples_per_prompt": 4})
    raw["train"].update(train)
    return MiniverlConfig.model_validate(raw)


def _checkpointed(runtime: object) -> list[bool]:
    from miniverl.runtime.loading import decoder_of

    return [bool(getattr(layer, "gradient_checkpointing", False)) for layer in decoder_of(runtime._student).layers]  # type: ignore[attr-defined]


def test_no_budget_changes_nothing(tiny_model_dir: Path, prompts: Path) -> None:
    from miniverl.data import load_prompts
    from miniverl.runtime import build_runtime
    from miniverl.training.memory import plan_memory

    config = _config(tiny_model_dir, activation_checkpointing="auto", trajectory_batch_size="auto")
    runtime = build_runtime(config.models, device=torch.device("cpu"))
    before = runtime.auto  # type: ignore[attr-defined]
    assert plan_memory(config, runtime, load_prompts(config.data.path), "fp32") is None
    assert runtime.auto == before and not any(_checkpointed(runtime))  # type: ignore[attr-defined]


def test_a_budget_turns_on_the_checkpointing_and_micro_batch_it_chose(tiny_model_dir: Path, prompts: Path) -> None:
    from miniverl.data import load_prompts
    from miniverl.runtime import build_runtime
    from miniverl.training.memory import plan_memory, workload_of

    config = _config(tiny_model_dir, activation_checkpointing="auto", trajectory_batch_size="auto")
    runtime = build_runtime(config.models, device=torch.device("cpu"))
    rows = load_prompts(config.data.path)
    dims = DecoderDims.from_hf_config(runtime.student_config())
    work = workload_of(config, runtime, rows, "fp32")
    assert work.update_rows == 8 and not work.fast_engine  # CPU: the HF engine
    # a budget that holds the whole step only with every layer checkpointed
    everything = estimate(dims, work, micro_rows=8, checkpointed_layers=dims.layers).peak
    assert estimate(dims, work, micro_rows=8, checkpointed_layers=0).peak > everything
    budget = everything / GIB * 1.0001
    config.memory.max_peak_reserved_gib = budget
    plan = plan_memory(config, runtime, rows, "fp32")
    assert plan is not None and plan.fits and plan.micro_rows == 8
    assert plan.activation_checkpointing >= 1
    flags = _checkpointed(runtime)
    assert flags == [i % plan.activation_checkpointing == 0 for i in range(dims.layers)]
    assert runtime.auto.max_tokens == plan.max_tokens  # type: ignore[attr-defined]
    with runtime.use("student") as student:
        assert student.auto.max_tokens == plan.max_tokens  # type: ignore[attr-defined]


def test_given_integers_are_not_overridden(tiny_model_dir: Path, prompts: Path) -> None:
    from miniverl.data import load_prompts
    from miniverl.runtime import build_runtime
    from miniverl.training.memory import plan_memory

    config = _config(tiny_model_dir, activation_checkpointing=0, trajectory_batch_size=2)
    config.memory.max_peak_reserved_gib = 1e-6  # nothing fits: the plan says so and keeps the given settings
    runtime = build_runtime(config.models, device=torch.device("cpu"))
    before = runtime.auto  # type: ignore[attr-defined]
    plan = plan_memory(config, runtime, load_prompts(config.data.path), "fp32")
    assert plan is not None and not plan.fits and plan.micro_rows == 2 and plan.activation_checkpointing == 0
    assert runtime.auto == before and not any(_checkpointed(runtime))  # type: ignore[attr-defined]


def test_auto_checkpointing_without_a_budget_trains_as_before(
    cli, write_config, tiny_model_dir, prompts, workdir
) -> None:
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    config["train"].update({"cycles": 1, "activation_checkpointing": "auto"})
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "a", "--json")
    assert result.code == 0, result.err
    line = json.loads((workdir / "runs/a/metrics.jsonl").read_text().splitlines()[0])
    assert not any(k.startswith("memory_plan/") for k in line["algorithm_metrics"])


def _rollout(runtime: object, rows: list, version: int) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    from miniverl.rollout.hf import generate_group

    with runtime.generation_model() as model:  # type: ignore[attr-defined]
        out = generate_group(
            model, runtime.tokenizer, rows, samples_per_prompt=2, max_new_tokens=5, temperature=1.0, seed=3,  # type: ignore[attr-defined]
            policy_version=version, batch_size=4, engine="fast",
        )  # fmt: skip
    return [(t.response_token_ids, t.sampled_logprobs) for t in out]


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("runtime_kind", ["dual_model", "shared_backbone"])
def test_a_released_rollout_engine_is_dropped_after_every_rollout_and_samples_the_same(
    tiny_model_dir: Path, prompts: Path, runtime_kind: str, device: str
) -> None:
    """The plan's ``release_rollout``: leaving ``generation_model`` drops the fast engine (its folded copy,
    cache and graphs), so the update runs without them; the next rollout folds afresh and samples the same
    tokens as an engine kept resident. On CUDA nothing of it stays allocated or reserved."""
    from miniverl.data import load_prompts
    from miniverl.rollout import engine as engine_module
    from miniverl.runtime import build_runtime

    config = _config(tiny_model_dir)
    config.models.runtime = runtime_kind  # type: ignore[assignment]
    rows = load_prompts(config.data.path)[:2]
    engine_module.release_engines()
    kept = build_runtime(config.models, device=torch.device(device))
    released = build_runtime(config.models, device=torch.device(device))
    released.apply_memory_plan(activation_checkpointing=0, max_tokens=None, release_rollout_engine=True)
    policies = []
    for runtime in (kept, released):
        with runtime.generation_model() as model:
            policies.append(model)
    for version in (0, 1):
        kept_rows = _rollout(kept, rows, version)
        cuda = device == "cuda"
        if cuda:
            torch.cuda.empty_cache()
            before = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
        assert _rollout(released, rows, version) == kept_rows
        assert policies[0] in engine_module._ENGINES  # resident between rollouts
        assert policies[1] not in engine_module._ENGINES  # given back when the rollout ended
        if cuda:
            assert torch.cuda.memory_allocated() == before[0]
            assert torch.cuda.memory_reserved() <= before[1]  # the graphs' pool went back too
    engine_module.release_engines()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the budget is measured from CUDA's peak reserved memory")
def test_a_cuda_run_records_its_plan_and_stays_under_the_budget(
    cli, write_config, tiny_model_dir, prompts, workdir
) -> None:
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    config["models"].update({"device": "cuda", "dtype": "bfloat16"})
    config["train"].update({"cycles": 2, "activation_checkpointing": "auto", "trajectory_batch_size": "auto"})
    config["memory"] = {"max_peak_reserved_gib": 2.0}
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "c", "--json")
    assert result.code == 0, result.err
    lines = [json.loads(x) for x in (workdir / "runs/c/metrics.jsonl").read_text().splitlines()]
    for line in lines:
        metrics = line["algorithm_metrics"]
        assert metrics["memory_plan/budget_gib"] == pytest.approx(2.0)
        assert metrics["train/adapter_bf16_master"] == 1.0  # auto: a bfloat16 student on CUDA
        assert line["peak_reserved_bytes"] <= 2.0 * GIB


def test_offline_rows_are_measured_from_the_oracle_responses(tiny_model_dir: Path, prompts: Path) -> None:
    from miniverl.data import load_prompts
    from miniverl.runtime import build_runtime
    from miniverl.training.algorithms.sft import oracle_trajectories
    from miniverl.training.memory import workload_of

    raw = tiny_config(tiny_model_dir, algorithm="sft")
    raw["rollout"]["max_new_tokens"] = 1  # not what SFT trains on: the data's answers are
    config = MiniverlConfig.model_validate(raw)
    runtime = build_runtime(config.models, device=torch.device("cpu"))
    rows = load_prompts(config.data.path)
    work = workload_of(config, runtime, rows, "fp32")
    longest = max(
        len(t.prompt_token_ids) + len(t.response_token_ids)
        for t in oracle_trajectories(config, runtime.tokenizer, rows, policy_version=0)
    )
    assert work.row_tokens == longest and work.rollout_rows == 0 and not work.fast_engine


def test_fused_kernels_that_cannot_run_here_are_refused_before_any_model_loads(
    cli, write_config, tiny_model_dir, prompts, workdir
) -> None:
    """liger-kernel runs on CUDA only: a CPU run stops in one line, leaving no run directory."""
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    config["train"]["fused_kernels"] = "liger"
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "f")
    assert result.code == 1 and result.err.count("\n") == 1, result.err
    assert result.err.startswith("miniverl: error: train.fused_kernels liger: ") and "CUDA only" in result.err
    assert "load:" not in result.out + result.err and not (workdir / "runs" / "f").exists()
