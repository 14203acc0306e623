"""Repeated passes on a tiny model (issue #19): GRPO and PPO make ppo_epochs x mini_batches actor steps per
cycle (the critic its own count), the clip acts on the drift, and a kill inside the second pass resumes
tensor-exact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from miniverl.training.algorithms.base import TrainedParameters
from tests.conftest import tiny_config
from tests.integration.test_ppo import PLUGIN, _every_checkpoint_tensor, _metrics, _plan, _untimed_metrics, ppo_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def grpo_config(model_dir: Path, **grpo: object) -> dict[str, Any]:
    config = tiny_config(model_dir)
    config["algorithm"]["rewards"] = PLUGIN
    config["algorithm"]["grpo"] = {"ppo_epochs": 2, "mini_batches": 2, "clip_low": 0.02, "clip_high": 0.02, **grpo}
    config["rollout"].update(prompts_per_cycle=2, samples_per_prompt=4)
    config["train"]["learning_rate"] = 0.05
    return config


def test_grpo_two_epochs_of_two_mini_batches_step_four_times_and_the_clip_acts(
    cli, write_config, tiny_model_dir, prompts, workdir: Path
) -> None:
    _plan(cli, write_config, grpo_config(tiny_model_dir))
    result = cli("run", "--plan", "plan.json", "--run-id", "g", "--json")
    assert result.code == 0, result.err
    lines = [line["algorithm_metrics"] for line in _metrics(workdir / "runs" / "g")]
    assert len(lines) == 2
    for m in lines:
        assert (m["actor/updates"], m["actor/passes"], m["actor/mini_batches"]) == (4, 2, 2)
        assert "critic/updates" not in m
    # the old log-probs are the rollout's: after the first step the ratio moves and the clip acts
    assert max(m["actor/pg_clipfrac"] for m in lines) > 0
    assert all(m["actor/ppo_kl"] != 0 for m in lines)


@pytest.mark.parametrize("kl_mode", ["loss", "reward"])
def test_grpo_passes_with_a_kl_to_the_reference(cli, write_config, tiny_model_dir, prompts, workdir, kl_mode) -> None:
    config = grpo_config(tiny_model_dir, kl_coef=0.1, kl_estimator="low_var_kl", kl_mode=kl_mode)
    config["models"]["reference"] = {"source": "student"}
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "kl", "--json")
    assert result.code == 0, result.err
    lines = _metrics(workdir / "runs" / "kl")
    assert [line["algorithm_metrics"]["actor/updates"] for line in lines] == [4, 4]
    if kl_mode == "loss":  # cycle 1 starts at the reference: only the later steps' drift makes the mean KL > 0
        assert lines[0]["kl"] > 0
    else:  # the penalty uses the rollout weights: 0 at the reference, > 0 once the policy moved
        assert lines[0]["algorithm_metrics"]["kl_reward_penalty_mean"] == 0
        assert lines[1]["algorithm_metrics"]["kl_reward_penalty_mean"] > 0


def test_grpo_one_pass_keeps_one_step_and_logs_no_drift(cli, write_config, tiny_model_dir, prompts, workdir) -> None:
    _plan(cli, write_config, grpo_config(tiny_model_dir, ppo_epochs=1, mini_batches=1))
    result = cli("run", "--plan", "plan.json", "--run-id", "one", "--json")
    assert result.code == 0, result.err
    for line in _metrics(workdir / "runs" / "one"):
        m = line["algorithm_metrics"]
        assert (m["actor/updates"], m["actor/passes"], m["actor/mini_batches"]) == (1, 1, 1)
        assert "actor/pg_clipfrac" not in m  # the ratio is exactly 1: nothing to measure


def test_ppo_critic_counts_follow_the_critic_settings(cli, write_config, tiny_model_dir, prompts, workdir) -> None:
    config = ppo_config(
        tiny_model_dir, ppo_epochs=2, mini_batches=2, critic_ppo_epochs=3, critic_mini_batches=1, clip_low=0.02,
        clip_high=0.02,
    )  # fmt: skip
    config["train"]["learning_rate"] = 0.05
    _plan(cli, write_config, config)
    result = cli("run", "--plan", "plan.json", "--run-id", "c", "--json")
    assert result.code == 0, result.err
    lines = [line["algorithm_metrics"] for line in _metrics(workdir / "runs" / "c")]
    for m in lines:
        assert (m["actor/updates"], m["actor/passes"], m["actor/mini_batches"]) == (4, 2, 2)
        assert (m["critic/updates"], m["critic/passes"], m["critic/mini_batches"]) == (3, 3, 1)
        assert m["critic/delta_norm"] > 0
    assert max(m["actor/pg_clipfrac"] for m in lines) > 0  # the later steps drift past the clip
    report = cli("inspect", str(workdir / "runs" / "c"), "--json").json()
    assert report["ppo"]["critic_updates"] == 6


def test_a_grpo_mini_batch_that_splits_a_group_is_one_error_line(cli, write_config, tiny_model_dir, prompts, workdir):
    write_config(grpo_config(tiny_model_dir, mini_batches=3))
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert result.code == 2 and not (workdir / "plan.json").exists()
    (line,) = result.err.strip().splitlines()
    assert "algorithm.grpo.mini_batches (3) must divide rollout.prompts_per_cycle (2)" in line


class Kill(Exception):
    pass


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_a_kill_inside_the_second_pass_resumes_tensor_exact(
    cli, write_config, tiny_model_dir, prompts, workdir: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    """A straight run; then a run killed in cycle 2 just before the actor's first step of its second pass (the
    first pass's steps taken, the next mini-batch's gradients accumulated), resumed. Every tensor of the last
    checkpoint and every metrics line (but wall-clock seconds) equal the straight run's. LoRA dropout makes the
    update draw on the RNG, so the restored RNG state is exercised as well as the seeded mini-batch order."""
    from miniverl.training.entry import run_from_plan

    if algorithm == "grpo":
        config = grpo_config(tiny_model_dir)
    else:
        config = ppo_config(tiny_model_dir, ppo_epochs=2, mini_batches=2, critic_ppo_epochs=1, critic_mini_batches=1)
    config["models"]["student"]["lora"]["dropout"] = 0.1
    _plan(cli, write_config, config)
    run_from_plan(Path("plan.json"), output=Path("runs"), run_id="straight")
    straight = _every_checkpoint_tensor(workdir / "runs/straight")
    straight_metrics = _untimed_metrics(workdir / "runs/straight")
    assert [m["algorithm_metrics"]["actor/updates"] for m in straight_metrics] == [4, 4]

    real_step = TrainedParameters.step
    killed: list[int] = []

    def step(self: TrainedParameters) -> tuple[float, float]:
        # the actor after cycle 1's 4 steps and cycle 2's first pass (2 steps), inside cycle 2's second pass
        if self.steps_taken == 6 and len(self._update_steps) == 2 and not killed:
            killed.append(self.steps_taken)
            raise Kill
        return real_step(self)

    with monkeypatch.context() as patch:
        patch.setattr(TrainedParameters, "step", step)
        with pytest.raises(Kill):
            run_from_plan(Path("plan.json"), output=Path("runs"), run_id="cut")
    assert killed == [6]
    resumed = cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", "cut", "--resume", "--json")
    assert resumed.code == 0, resumed.err
    assert resumed.json()["summary"]["resumed_from_step"] == 1
    cut = _every_checkpoint_tensor(workdir / "runs/cut")
    assert straight.keys() == cut.keys()
    for file_name in straight:
        assert straight[file_name].keys() == cut[file_name].keys(), file_name
        for name in straight[file_name]:
            assert straight[file_name][name].equal(cut[file_name][name]), (file_name, name)
    assert _untimed_metrics(workdir / "runs/cut") == straight_metrics
