"""The policy-gradient fail-closed boundary (issue #11): foreign log-probs never reach a loss.

``ForeignLogprobBackend`` is a named test double: it samples with the in-process generator, then
replaces every sampled log-prob with a deliberately wrong constant and says its log-probs come from
another engine (as vLLM's would). With the recompute on (miniverl's default) GRPO and PPO take
``old_logp`` from the training model, equal to a teacher-forced forward computed here independently;
with the recompute off the run refuses with one named line before any update.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.rollout import backends
from miniverl.rollout.backends import (
    OLD_LOGP_RECOMPUTED,
    ForeignLogprobError,
    InProcessBackend,
    old_logp_origin,
)
from miniverl.runtime.memory_plan import DecoderDims, kv_cache_bytes
from miniverl.training import memory as training_memory
from tests.conftest import CliResult, tiny_config

FOREIGN_LOGPROB = -0.321  # what the double claims every sampled token had: wrong for any real model
REWARDS = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class ForeignLogprobBackend(InProcessBackend):
    """Samples in process but reports foreign, deliberately wrong log-probs (a stand-in for vLLM)."""

    name = "foreign-test-double"
    logprob_source = "foreign"

    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        sampled = super().generate(model, tokenizer, prompts, **sampling)
        return [
            dataclasses.replace(t, sampled_logprobs=(FOREIGN_LOGPROB,) * len(t.response_token_ids)) for t in sampled
        ]


def _teacher_forced(model: Any, trajectory: Any) -> torch.Tensor:
    """log p(response token | prefix) from one full forward of ``model`` (no batching, no padding)."""
    prompt, response = list(trajectory.prompt_token_ids), list(trajectory.response_token_ids)
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(response)[:, None])[:, 0]


class Spy:
    """Per update: the teacher-forced log-probs at update start, and every ``old_logp`` the loss was given."""

    def __init__(self) -> None:
        self.expected: list[torch.Tensor] = []
        self.sampled: list[torch.Tensor] = []
        self.used: list[list[torch.Tensor]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, algorithm: str) -> None:
        from miniverl.training.algorithms import grpo, ppo

        module = grpo if algorithm == "grpo" else ppo
        cls = grpo.Grpo if algorithm == "grpo" else ppo.Ppo
        real_update, real_loss = cls.update, module.ppo_clip_token_losses
        spy = self

        def update(self: Any, batch: Any, *, step: int) -> Any:
            with self.runtime.generation_model() as model, torch.no_grad():
                spy.expected.append(torch.cat([_teacher_forced(model, t) for t in batch.trajectories]))
            spy.sampled.append(torch.tensor([lp for t in batch.trajectories for lp in t.sampled_logprobs]))
            spy.used.append([])
            return real_update(self, batch, step=step)

        def loss(logp: torch.Tensor, old_logp: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            spy.used[-1].append(old_logp.detach().reshape(-1).clone())
            return real_loss(logp, old_logp, *args, **kwargs)

        monkeypatch.setattr(cls, "update", update)
        monkeypatch.setattr(module, "ppo_clip_token_losses", loss)

    def used_sorted(self, k: int) -> torch.Tensor:
        return torch.sort(torch.cat(self.used[k]).float()).values


def _run(
    cli: Callable[..., CliResult], write_config: Callable[..., Path], model_dir: Path, algorithm: str, **rollout: Any
) -> CliResult:
    from miniverl.rollout.engine import release_engines

    release_engines()
    config = tiny_config(model_dir, algorithm=algorithm)
    config["train"].update({"cycles": 2, "learning_rate": 0.05})
    config["rollout"].update({"samples_per_prompt": 3, "engine": "hf", **rollout})
    config["algorithm"]["rewards"] = REWARDS
    write_config(config)
    planned = cli("plan", "config.yaml", "--out", "plan.json", "-q")
    assert planned.code == 0, planned.err
    return cli("run", "--plan", "plan.json", "--run-id", "r", "--threads", "1", "-q")


def _metrics(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "runs/r/metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_foreign_logprobs_are_replaced_by_the_trainers_recompute(
    algorithm: str,
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(backends.BACKENDS, "hf", ForeignLogprobBackend)
    spy = Spy()
    spy.install(monkeypatch, algorithm)
    result = _run(cli, write_config, tiny_model_dir, algorithm)
    assert result.code == 0, result.err
    assert len(spy.expected) == 2  # both updates ran
    for k in range(2):
        assert torch.all(spy.sampled[k] == FOREIGN_LOGPROB)  # the update was handed the wrong values...
        used = spy.used_sorted(k)
        assert used.numel() == spy.expected[k].numel()
        # ... and used the teacher-forced forward of the training model instead
        torch.testing.assert_close(used, torch.sort(spy.expected[k]).values, atol=1e-4, rtol=1e-4)
        assert not torch.isclose(used, torch.tensor(FOREIGN_LOGPROB), atol=1e-6).any()
    assert [m["algorithm_metrics"][OLD_LOGP_RECOMPUTED] for m in _metrics(workdir)] == [1.0, 1.0]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_foreign_logprobs_without_recompute_refuse_the_run(
    algorithm: str,
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from miniverl.training.algorithms import ALGORITHMS

    monkeypatch.setitem(backends.BACKENDS, "hf", ForeignLogprobBackend)
    monkeypatch.setattr(ALGORITHMS[algorithm], "recompute_old_logp", False)
    spy = Spy()
    spy.install(monkeypatch, algorithm)
    result = _run(cli, write_config, tiny_model_dir, algorithm)
    assert result.code == 1
    assert result.err.strip().splitlines() == [
        f"miniverl: error: {algorithm}: refusing the update: the rollout's log-probs come from another engine "
        "(foreign) and old_logp recompute is off; a policy-gradient update needs old_logp recomputed by the "
        "training model"
    ]
    assert spy.used == [[]]  # refused before any loss saw a log-prob
    assert _metrics(workdir) == []  # no update was recorded


def test_trainer_logprobs_without_recompute_are_the_rollouts(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other side: the trainer's own sampled log-probs at temperature 1 may stand in for old_logp."""
    from miniverl.training.algorithms.grpo import Grpo

    monkeypatch.setattr(Grpo, "recompute_old_logp", False)
    spy = Spy()
    spy.install(monkeypatch, "grpo")
    result = _run(cli, write_config, tiny_model_dir, "grpo")
    assert result.code == 0, result.err
    for k in range(2):
        torch.testing.assert_close(spy.used_sorted(k), torch.sort(spy.sampled[k].float()).values)
        # the hf loop's sampled log-probs are the trainer's own at temperature 1: near the teacher-forced ones
        torch.testing.assert_close(spy.used_sorted(k), torch.sort(spy.expected[k]).values, atol=1e-4, rtol=1e-4)
    assert [m["algorithm_metrics"][OLD_LOGP_RECOMPUTED] for m in _metrics(workdir)] == [0.0, 0.0]


def test_old_logp_origin() -> None:
    assert old_logp_origin("foreign", recompute=True, algorithm="grpo", plain_sampling=False) == "trainer"
    assert old_logp_origin("trainer", recompute=True, algorithm="grpo", plain_sampling=True) == "trainer"
    assert old_logp_origin("trainer", recompute=False, algorithm="ppo", plain_sampling=True) == "rollout"
    with pytest.raises(ForeignLogprobError, match="another engine"):
        old_logp_origin("foreign", recompute=False, algorithm="ppo", plain_sampling=True)
    with pytest.raises(ForeignLogprobError, match="temperature-scaled or filtered"):
        old_logp_origin("trainer", recompute=False, algorithm="grpo", plain_sampling=False)


def test_backends_report_their_logprob_source() -> None:
    assert backends.BACKENDS["hf"].logprob_source == "trainer"
    assert backends.BACKENDS["vllm"].logprob_source == "foreign"


def test_plan_refuses_vllm_where_it_is_not_installed(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backends, "vllm_installed", lambda: False)
    write_config(tiny_config(tiny_model_dir))
    result = cli("plan", "config.yaml", "--set", "rollout.backend=vllm", "--out", "plan.json", "--json")
    assert result.code == 1 and result.out == ""
    assert result.err.splitlines() == [
        "miniverl: error: rollout.backend vllm: vllm is not installed, so this run cannot sample with it; "
        "use rollout.backend hf"
    ]
    assert not (workdir / "plan.json").exists()


def test_plan_accepts_vllm_where_it_is_installed(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backends, "vllm_installed", lambda: True)
    write_config(tiny_config(tiny_model_dir))
    result = cli("plan", "config.yaml", "--set", "rollout.backend=vllm", "--out", "plan.json", "-q")
    assert result.code == 0, result.err
    assert json.loads((workdir / "plan.json").read_text())["config"]["rollout"]["backend"] == "vllm"


@pytest.mark.parametrize("installed", [True, False])
def test_plan_refuses_pg_taking_vllms_logprobs_by_name(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    installed: bool,
) -> None:
    """The fail-closed boundary at plan time: algorithm.old_logp rollout with vllm, whether or not vllm is here."""
    monkeypatch.setattr(backends, "vllm_installed", lambda: installed)
    write_config(tiny_config(tiny_model_dir))
    result = cli(
        "plan", "config.yaml", "--set", "rollout.backend=vllm", "--set", "algorithm.old_logp=rollout", "--out", "p.json"
    )
    assert result.code == 1
    assert result.err.splitlines() == [f"miniverl: error: {backends.VLLM_LOGPROBS_AS_OLD_LOGP}"]
    assert not (workdir / "p.json").exists()


def test_run_rechecks_the_backend_of_a_plan(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A vllm plan made where vllm passed the check still refuses to run where it does not."""
    monkeypatch.setattr(backends, "vllm_installed", lambda: True)
    write_config(tiny_config(tiny_model_dir))
    assert cli("plan", "config.yaml", "--set", "rollout.backend=vllm", "--out", "plan.json", "-q").code == 0
    monkeypatch.undo()
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(backends, "vllm_installed", lambda: False)
    result = cli("run", "--plan", "plan.json", "--run-id", "r", "--threads", "1", "-q")
    assert result.code == 1
    assert result.err.splitlines()[-1].startswith("miniverl: error: rollout.backend vllm: vllm is not installed")


def test_trajectory_files_keep_each_group_whole(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
) -> None:
    """What the harness's grouped-identity check reads: per cycle file, every group one prompt and one policy
    version (the updates before the cycle), sample indices 0..n-1 once each, group ids distinct across cycles."""
    result = _run(cli, write_config, tiny_model_dir, "grpo", engine="fast")
    assert result.code == 0, result.err
    seen: set[str] = set()
    for cycle in (1, 2):
        records = [json.loads(line) for line in (workdir / f"runs/r/trajectories/cycle-{cycle:06d}.jsonl").open()]
        assert len(records) == 2 * 3  # prompts_per_cycle x samples_per_prompt
        groups: dict[str, list[dict[str, Any]]] = {}
        for record in records:
            groups.setdefault(record["group_id"], []).append(record)
        assert len(groups) == 2 and not seen & set(groups)
        seen |= set(groups)
        for members in groups.values():
            assert len({(m["prompt_id"], tuple(m["prompt_token_ids"])) for m in members}) == 1
            assert {m["policy_version"] for m in members} == {cycle - 1}
            assert sorted(m["sample_index"] for m in members) == [0, 1, 2]


class FakeVllmBackend(backends.VllmBackend):
    """``rollout.backend: vllm`` over :class:`tests.unit.test_vllm_engine.FakeVllmLLM`, a named fake of
    ``vllm.LLM`` (vllm cannot be installed here): the product's whole vLLM path but the engine itself. What it
    writes goes to a test's tmp dir, never into harness evidence."""

    def __init__(self) -> None:
        from miniverl.rollout.vllm_engine import AdapterVersions, VllmEngine
        from tests.unit.test_vllm_engine import FakeVllmLLM

        def factory(model: Any) -> VllmEngine:
            root = Path.cwd() / "fake-vllm-adapters"
            return VllmEngine(
                llm=FakeVllmLLM(),
                version="0.0.0+fake",
                adapters=AdapterVersions(root),
                sampling_params=dict,
                lora_request=lambda name, lora_id, path: (name, lora_id, path),
                asleep=True,
            )

        super().__init__(factory)


def test_a_vllm_run_writes_what_the_harness_vllm_contract_reads(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each line: rollout_backend vllm, the trainer recomputed old_logp, the mismatch and switch times; each
    trajectory: vLLM's sampled log-probs beside the trainer's old ones. The harness's own vLLM cycle check passes
    on it, and one adapter was saved per policy version."""
    from harness.qualify.full import refresh

    monkeypatch.setattr(backends, "vllm_installed", lambda: True)
    monkeypatch.setitem(backends.BACKENDS, "vllm", FakeVllmBackend)
    result = _run(cli, write_config, tiny_model_dir, "grpo", backend="vllm")
    assert result.code == 0, result.err
    lines = _metrics(workdir)
    assert [line["rollout_backend"] for line in lines] == ["vllm", "vllm"]
    for cycle, line in enumerate(lines, start=1):
        metrics = line["algorithm_metrics"]
        assert metrics[OLD_LOGP_RECOMPUTED] == 1.0
        assert {"rollout/mismatch_ratio_outside_frac", "rollout/vllm_wake_seconds"} <= set(metrics)
        records = [json.loads(r) for r in (workdir / f"runs/r/trajectories/cycle-{cycle:06d}.jsonl").open()]
        assert all(r["rollout_backend_version"] == "0.0.0+fake" for r in records)
        why, version = refresh._vllm_cycle(cycle, line, records)
        assert (why, version) == (None, "0.0.0+fake")
    assert sorted(p.name for p in (workdir / "fake-vllm-adapters").iterdir()) == ["policy-v0", "policy-v1"]


def test_the_real_vllm_backend_builds_its_engine_from_the_students_folder_and_rank(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``VllmBackend`` without a factory, over a named fake ``vllm`` module (``LLM`` is
    :class:`tests.unit.test_vllm_engine.FakeVllmLLM`): ``vllm.LLM`` gets the student's transformers folder, its
    LoRA rank, LoRA and sleep mode on and the backend's memory share, in this process; each policy version's
    adapter goes under the run's vLLM scratch folder."""
    import os
    import sys
    import tempfile
    import types

    from tests.unit.test_vllm_engine import FakeVllmLLM

    built: list[dict[str, Any]] = []

    class FakeModuleLLM(FakeVllmLLM):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            built.append(kwargs)

    fake = types.ModuleType("vllm")
    fake.__dict__.update(__version__="0.0.0+fake-module", LLM=FakeModuleLLM, SamplingParams=dict)
    request = types.ModuleType("vllm.lora.request")
    request.__dict__["LoRARequest"] = lambda name, lora_id, path: (name, lora_id, path)
    for name, module in (("vllm", fake), ("vllm.lora", types.ModuleType("vllm.lora")), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(backends, "vllm_installed", lambda: True)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    (workdir / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(workdir / "tmp"))
    # vLLM runs on CUDA only: the plan reads the device's memory there (an 80 GiB card stands in for it here)
    monkeypatch.setattr(training_memory, "device_total_bytes", lambda device: 80.0 * (1 << 30))
    result = _run(cli, write_config, tiny_model_dir, "grpo", backend="vllm")
    assert result.code == 0, result.err
    assert len(built) == 1
    kwargs = built[0]
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    rank = config["models"]["student"]["lora"]["r"]
    assert kwargs["model"] == str(tiny_model_dir) and kwargs["max_lora_rank"] == rank
    assert kwargs["enable_lora"] and kwargs["enable_sleep_mode"]
    # the memory plan's share: a tiny model's weights, cache and vLLM's runtime bound, a few hundredths of 80 GiB
    share = kwargs["gpu_memory_utilization"]
    assert 0.0 < share <= 0.05 and round(share * 100) == share * 100
    assert kwargs["max_num_seqs"] == 4  # one rollout batch: batch_size 4 of the cycle's 2 x 3 rows
    assert kwargs["max_model_len"] > config["rollout"]["max_new_tokens"]
    # the KV cache is the plan's (vLLM's own profiling reads the whole device's free memory): 4 rows at full length
    from transformers import AutoConfig

    dims = DecoderDims.from_hf_config(AutoConfig.from_pretrained(tiny_model_dir))
    rows_kv = kv_cache_bytes(dims, 4, kwargs["max_model_len"], 2.0)
    assert rows_kv < kwargs["kv_cache_memory_bytes"] < share * 80 * (1 << 30)
    assert {line["algorithm_metrics"]["rollout/vllm_memory_share"] for line in _metrics(workdir)} == {share}
    assert kwargs["logprobs_mode"] == "processed_logprobs" and kwargs["enforce_eager"] is False
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    (scratch,) = (workdir / "tmp").iterdir()
    assert sorted(p.name for p in (scratch / "adapters").iterdir()) == ["policy-v0", "policy-v1"]
    assert [line["rollout_backend"] for line in _metrics(workdir)] == ["vllm", "vllm"]
    records = [json.loads(r) for r in (workdir / "runs/r/trajectories/cycle-000001.jsonl").open()]
    assert {r["rollout_backend_version"] for r in records} == {"0.0.0+fake-module"}


def test_the_real_vllm_backend_off_cuda_is_refused_in_one_line(
    workdir: Path,
    prompts: Path,
    tiny_model_dir: Path,
    cli: Callable[..., CliResult],
    write_config: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a CUDA device there is no memory plan for vLLM: the run stops in one line before vLLM is built."""
    monkeypatch.setattr(backends, "vllm_installed", lambda: True)
    result = _run(cli, write_config, tiny_model_dir, "grpo", backend="vllm")
    assert result.code != 0
    assert "no memory plan for vLLM" in result.err and "Traceback" not in result.err
    assert len([line for line in result.err.splitlines() if line.strip()]) == 1
