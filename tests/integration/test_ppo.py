"""PPO on a tiny model: actor + critic updates, GAE, metrics, kill/resume at every phase, inspect/export."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.conftest import CliResult, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PLUGIN = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]
CRITIC_FILES = ("critic_params.safetensors", "critic_optimizer.safetensors")


def ppo_config(model_dir: Path, **ppo: object) -> dict:
    config = tiny_config(model_dir, algorithm="ppo")
    config["algorithm"]["rewards"] = PLUGIN
    config["algorithm"]["ppo"] = {"mini_batches": 2, "ppo_epochs": 1, "critic_learning_rate": 0.01, **ppo}
    return config


def _plan(cli: Callable[..., CliResult], write_config, config: dict) -> None:
    write_config(config)
    result = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert result.code == 0, result.err


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _final(run_dir: Path) -> dict[str, dict]:
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    names = ("student_params.safetensors", "optimizer.safetensors", *CRITIC_FILES)
    return {name: load_file(last / name) for name in names}


def _assert_gae_recomputes(path: Path) -> None:
    """Each record's GAE row is what gae_advantages and masked_whiten give for the rows kept beside it (float64,
    exactly), its reward sits on its last response token, and its advantage is its whitened tokens' mean."""
    import torch

    from miniverl.algorithms import gae_advantages, masked_whiten
    from miniverl.rollout.records import read_trajectories_jsonl

    records = read_trajectories_jsonl(path)
    gae = [r.gae for r in records]
    assert all(g is not None for g in gae)

    def rows(key: str) -> torch.Tensor:
        return torch.tensor([getattr(g, key) for g in gae], dtype=torch.float64)

    mask = rows("mask").bool()
    adv, returns = gae_advantages(rows("rewards"), rows("values"), mask, gamma=1.0, lam=0.95)
    assert adv.equal(rows("advantages")) and returns.equal(rows("returns"))
    assert masked_whiten(adv, mask).equal(rows("whitened_advantages"))
    for record, g in zip(records, gae, strict=True):
        assert g is not None and g.whitened_advantages is not None
        n = len(record.response_token_ids)
        assert g.rewards[n - 1] == record.reward and not any(g.rewards[: n - 1])
        assert record.advantage == pytest.approx(sum(g.whitened_advantages[:n]) / n, abs=1e-6)


def test_ppo_dual_model_trains_actor_and_critic(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    _plan(cli, write_config, ppo_config(tiny_model_dir))
    result = cli("run", "--plan", "plan.json", "--run-id", "p", "--json")
    assert result.code == 0, result.err
    summary = result.json()["summary"]
    assert summary["algorithm"] == "ppo" and summary["updates"] == 2
    assert summary["adapter_changed_each_update"] is True and summary["nonzero_advantages"] > 0
    run_dir = workdir / "runs" / "p"
    for line in _metrics(run_dir):
        m = line["algorithm_metrics"]
        assert m["actor/updates"] == 2 and m["critic/updates"] == 2  # 1 epoch x 2 mini-batches
        assert m["critic/delta_norm"] > 0 and line["adapter_delta_norm"] > 0
        assert m["critic/returns/mean"] != 0 and m["critic/advantages/max"] > m["critic/advantages/min"]
        for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/approx_kl", "actor/entropy", "critic/vf_loss",
                    "critic/vf_clipfrac", "critic/vf_explained_var", "critic/grad_norm"):  # fmt: skip
            assert key in m, key
        assert m["actor/entropy"] > 0 and m["critic/vf_loss"] > 0
    for cycle in (1, 2):
        _assert_gae_recomputes(run_dir / "trajectories" / f"cycle-{cycle:06d}.jsonl")
    # the critic's LoRA B moved off zero, i.e. the critic adapter itself was trained (not only its head)
    critic = _final(run_dir)["critic_params.safetensors"]
    assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in critic.items())
    assert "value_head.weight" in critic
    roles = json.loads((run_dir / "run.json").read_text())["roles"]["roles"]
    assert roles["critic"]["adapter_name"] == "critic"
    report = cli("inspect", str(run_dir), "--json").json()
    assert report["algorithm"] == "ppo" and report["ppo"]["critic_updates"] == 4
    exported = cli("export", str(run_dir), "--out", "adapter", "--json")
    assert exported.code == 0, exported.err
    payload = exported.json()
    assert payload["reload"]["passed"] and payload["critic"]["reload"]["passed"]
    assert (workdir / "adapter" / "critic" / "adapter_config.json").is_file()
    assert (workdir / "adapter" / "critic" / "value_head.safetensors").is_file()


def test_ppo_shared_backbone_critic_adapter(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = ppo_config(tiny_model_dir, mini_batches=1, ppo_epochs=2)
    config["models"]["runtime"] = "shared_backbone"
    config["train"]["cycles"] = 1
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "s", "--json")
    assert result.code == 0, result.err
    (line,) = _metrics(workdir / "runs" / "s")
    m = line["algorithm_metrics"]
    assert m["actor/updates"] == 2 and m["critic/updates"] == 2  # 2 epochs x 1 mini-batch
    assert m["critic/delta_norm"] > 0 and line["adapter_delta_norm"] > 0
    # the second epoch sees a moved policy: a non-trivial ratio
    assert m["actor/approx_kl"] > 0
    tensors = _final(workdir / "runs" / "s")
    assert all(".critic." in k or k.startswith("value_head") for k in tensors["critic_params.safetensors"])
    assert all(".student." in k for k in tensors["student_params.safetensors"])
    exported = cli("export", str(workdir / "runs" / "s"), "--out", "adapter", "--json")
    assert exported.code == 0, exported.err
    assert exported.json()["critic"]["reload"]["passed"] and exported.json()["reload"]["passed"]


def _every_checkpoint_tensor(run_dir: Path) -> dict[str, dict]:
    """Every safetensors file of the last checkpoint, by relative path (params, optimizers, RNG, adapter dirs)."""
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    return {p.relative_to(last).as_posix(): load_file(p) for p in sorted(last.rglob("*.safetensors"))}


def _untimed_metrics(run_dir: Path) -> list[dict]:
    """The metrics lines without their wall-clock fields (``*_seconds``): everything else must match."""
    return [{k: v for k, v in line.items() if not k.endswith("_seconds")} for line in _metrics(run_dir)]


@pytest.mark.parametrize("runtime", ["dual_model", "shared_backbone"])
def test_ppo_kill_at_every_phase_resumes_tensor_exact(
    cli, write_config, tiny_model_dir, prompts, workdir: Path, runtime: str
) -> None:
    """One uninterrupted run; then, for each phase boundary ``on_phase`` exposes (rollout, score, update,
    checkpoint) of cycle 2, a run killed there and resumed. Every tensor of the last checkpoint (actor adapter
    and AdamW, critic adapter + value head and its AdamW, the exported adapter directories, the RNG state), the
    metrics lines (all but wall-clock seconds) and the trajectories equal the uninterrupted run's. LoRA dropout
    and two epochs of shuffled mini-batches make the update consume the RNG, so its restore is exercised."""
    from miniverl.training.controller import PHASES
    from miniverl.training.entry import run_from_plan

    config = ppo_config(tiny_model_dir, kl_coef=0.05, kl_estimator="low_var_kl", kl_mode="reward", ppo_epochs=2)
    config["models"]["runtime"] = runtime
    config["models"]["student"]["lora"]["dropout"] = 0.1
    if runtime == "dual_model":
        config["models"]["reference"] = {"source": "student"}
    else:  # shared: the reference is a pinned adapter on the same base
        from transformers import AutoConfig

        from miniverl.gate.models import write_random_adapter

        sha = write_random_adapter(AutoConfig.from_pretrained(tiny_model_dir), workdir / "ref", seed=3, r=4)
        config["models"]["reference"] = {
            "source": "student",
            "adapter": {"source": "local", "path": "ref", "sha256": sha},
        }
    _plan(cli, write_config, config)
    run_from_plan(Path("plan.json"), output=Path("runs"), run_id="straight")
    straight = _every_checkpoint_tensor(workdir / "runs/straight")
    both_roles = {"student_params.safetensors", "optimizer.safetensors", "rng.safetensors", *CRITIC_FILES}
    assert both_roles | {"critic/value_head.safetensors"} <= set(straight), sorted(straight)
    straight_metrics = _untimed_metrics(workdir / "runs/straight")
    assert len(straight_metrics) == 2
    trajectories = sorted((workdir / "runs/straight/trajectories").glob("*.jsonl"))
    assert len(trajectories) == 2
    assert PHASES == ("rollout", "score", "update", "checkpoint")

    class Kill(Exception):
        pass

    for phase in PHASES:
        seen: list[tuple[str, int]] = []

        def kill(name: str, step: int, phase: str = phase, seen: list = seen) -> None:
            seen.append((name, step))
            if step == 1 and name == phase:
                raise Kill

        with pytest.raises(Kill):
            run_from_plan(Path("plan.json"), output=Path("runs"), run_id=f"cut-{phase}", on_phase=kill)
        assert seen[-1] == (phase, 1) and seen[:4] == [(p, 0) for p in PHASES]
        resumed = cli(
            "run", "--plan", "plan.json", "--output", "runs", "--run-id", f"cut-{phase}", "--resume", "--json"
        )
        assert resumed.code == 0, resumed.err
        assert resumed.json()["summary"]["resumed_from_step"] == 1
        cut = _every_checkpoint_tensor(workdir / f"runs/cut-{phase}")
        assert straight.keys() == cut.keys(), phase
        for file_name in straight:
            assert straight[file_name].keys() == cut[file_name].keys(), (phase, file_name)
            for name in straight[file_name]:
                assert straight[file_name][name].equal(cut[file_name][name]), (phase, file_name, name)
        assert _untimed_metrics(workdir / f"runs/cut-{phase}") == straight_metrics, phase
        for path in trajectories:
            assert (workdir / f"runs/cut-{phase}/trajectories" / path.name).read_text() == path.read_text(), phase


@pytest.mark.parametrize("mode", ["loss", "reward"])
def test_grpo_with_kl_to_reference_logs_kl(cli, write_config, tiny_model_dir, prompts, workdir: Path, mode) -> None:
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    config["algorithm"]["grpo"] = {"kl_coef": 0.1, "kl_estimator": "k3", "kl_mode": mode}
    config["models"]["reference"] = {"source": "student"}
    config["train"]["cycles"] = 2
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "k", "--json")
    assert result.code == 0, result.err
    lines = _metrics(workdir / "runs" / "k")
    # step 1: the policy equals the reference (LoRA B = 0), so the KL is exactly 0; step 2 has moved
    if mode == "loss":
        assert lines[0]["kl"] == 0 and lines[1]["kl"] > 0
    else:
        assert lines[0]["algorithm_metrics"]["kl_reward_penalty_mean"] == 0
        assert lines[1]["algorithm_metrics"]["kl_reward_penalty_mean"] > 0


def test_ppo_with_rule_reward_and_reward_model(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = ppo_config(tiny_model_dir, mini_batches=1)
    config["algorithm"]["rewards"] = [*PLUGIN, {"name": "reward_model", "weight": 0.5}]
    config["models"]["reward"] = {"source": "tiny", "placement": "offload", "batch_size": 3}
    config["train"]["cycles"] = 1
    _plan(cli, write_config, config)
    plan = json.loads((workdir / "plan.json").read_text())
    assert plan["models"]["reward"]["source"] == "tiny" and len(plan["models"]["reward"]["config_sha256"]) == 64
    result = cli("run", "--plan", "plan.json", "--run-id", "rm", "--json")
    assert result.code == 0, result.err
    (line,) = _metrics(workdir / "runs" / "rm")
    m = line["algorithm_metrics"]
    assert m["reward_model/std"] > 0 and m["reward_model/offloaded_after_phase"] == 1.0
    # on a CPU run the device is the CPU: nothing to move, no device bytes, no CUDA measurement (the CUDA side
    # is tests/integration/test_reward_model_offload_cuda.py)
    assert m["reward_model/transfers"] == 0.0 and "reward_model/device_bytes_after_phase" not in m
    assert m["reward_model/bytes"] > 0 and line["update_start_allocated_bytes"] is None
    records = [json.loads(x) for x in (workdir / "runs/rm/trajectories/cycle-000001.jsonl").read_text().splitlines()]
    for rec in records:
        parts = rec["reward_components"]
        assert rec["reward"] == pytest.approx(
            parts["tests.helpers.rewards:digit_fraction"] + 0.5 * parts["reward_model"]
        )


def test_reward_model_config_errors(cli, write_config, tiny_model_dir, prompts) -> None:
    config = ppo_config(tiny_model_dir)
    config["models"]["reward"] = {"source": "tiny"}
    write_config(config)
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert result.code == 2 and "unused" in result.err and result.err.count("\n") == 1
    config["algorithm"]["rewards"] = [{"name": "reward_model"}]
    del config["models"]["reward"]
    write_config(config)
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert result.code == 2 and "models.reward" in result.err


def test_peak_memory_limit_is_refused_on_cpu(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = ppo_config(tiny_model_dir)
    config["memory"] = {"max_peak_reserved_gib": 14.5}
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "m")
    assert result.code == 2 and "max_peak_reserved_gib" in result.err and result.err.count("\n") == 1
    assert not (workdir / "runs" / "m").exists()


def test_sft_and_kd_from_the_config(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    sft = tiny_config(tiny_model_dir, algorithm="sft")
    sft["rollout"]["samples_per_prompt"] = 1
    _plan(cli, write_config, sft)
    result = cli("run", "--plan", "plan.json", "--run-id", "sft", "--json")
    assert result.code == 0, result.err
    lines = _metrics(workdir / "runs" / "sft")
    assert all(m["loss"] > 0 and m["reward_mean"] is None and m["adapter_delta_norm"] > 0 for m in lines)
    assert lines[1]["loss"] < lines[0]["loss"]  # two steps on cross-entropy at lr 0.01 lower it
    assert cli("export", str(workdir / "runs" / "sft"), "--out", "sft-adapter", "--json").code == 0

    kd = tiny_config(tiny_model_dir, algorithm="kd")
    kd["models"]["teacher"] = {"source": "student", "privileged_context": {"column": "context"}}
    kd["algorithm"]["offline"] = {"teacher_cache": "teacher-cache"}
    kd["algorithm"]["distill"] = {"objective": "topk_tail", "top_k": 8}
    for run_id in ("kd1", "kd2"):
        _plan(cli, write_config, kd)
        result = cli("run", "--plan", "plan.json", "--run-id", run_id, "--json")
        assert result.code == 0, result.err
    first, second = _metrics(workdir / "runs/kd1"), _metrics(workdir / "runs/kd2")
    assert first[0]["algorithm_metrics"]["kd/teacher_cache_reused"] == 0.0
    assert second[0]["algorithm_metrics"]["kd/teacher_cache_reused"] == 1.0
    assert [m["loss"] for m in first] == [m["loss"] for m in second]  # the reused cache gives the same targets
    assert all(m["kl"] > 0 for m in first)
    index = json.loads((workdir / "teacher-cache" / "index.json").read_text())
    assert index["kind"] == "topk"


def test_ppo_kl_as_a_loss_term(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = ppo_config(tiny_model_dir, kl_coef=0.1, kl_estimator="k3", kl_mode="loss", ppo_epochs=2, mini_batches=1)
    config["models"]["reference"] = {"source": "student"}
    config["train"]["cycles"] = 1
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "kl", "--json")
    assert result.code == 0, result.err
    (line,) = _metrics(workdir / "runs" / "kl")
    # epoch 1 starts at the reference (KL 0); epoch 2 has moved away from it
    assert line["kl"] == line["algorithm_metrics"]["actor/kl_loss"] > 0
    assert "actor/reward_kl_penalty" not in line["algorithm_metrics"]


def test_peak_memory_limit_fails_the_cycle_before_its_checkpoint(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from miniverl.training.controller import Controller, MemoryLimitError

    fake = SimpleNamespace(config=SimpleNamespace(memory=SimpleNamespace(max_peak_reserved_gib=1.0)))
    line = SimpleNamespace(peak_reserved_bytes=int(1.5 * 2**30), cycle=3)
    with pytest.raises(MemoryLimitError, match=r"cycle 3 reserved 1\.500 GiB"):
        Controller._check_memory_limit(fake, line)  # type: ignore[arg-type]
    Controller._check_memory_limit(fake, SimpleNamespace(peak_reserved_bytes=2**30, cycle=1))  # type: ignore[arg-type]
