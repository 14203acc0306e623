"""Config rules for PPO, the critic, KL estimators, the reward model and memory placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from miniverl.config.loader import load_config
from miniverl.errors import ConfigError

BASE = """
models:
  student: {source: builtin, model_id: smollm2-135m-instruct}
data: {path: prompts.parquet}
rollout: {prompts_per_cycle: 2, samples_per_prompt: 4}
"""


def _load(tmp_path: Path, *overrides: str):
    path = tmp_path / "c.yaml"
    path.write_text(BASE)
    return load_config(path, list(overrides))


def test_ppo_defaults_fill_the_critic_and_the_mini_batch_size(tmp_path: Path) -> None:
    config = _load(tmp_path, "algorithm.name=ppo", "algorithm.ppo.mini_batches=2")
    assert config.models.critic is not None and config.models.critic.source == "student"
    assert config.models.critic.lora == config.models.student.lora
    assert config.train.gradient_accumulation_steps == 4  # 8 trajectories / 2 mini-batches
    assert config.algorithm.ppo.kl_estimator == "k1" and config.algorithm.ppo.kl_mode == "reward"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=ppo", "algorithm.ppo.mini_batches=3"], "must divide"),
        (["algorithm.name=ppo", "train.gradient_accumulation_steps=8", "algorithm.ppo.mini_batches=2"], "mini-batch"),
        (["algorithm.name=ppo", "algorithm.ppo.kl_coef=0.1"], "needs models.reference"),
        (["algorithm.ppo.kl_estimator=k4", "algorithm.name=ppo"], "kl_estimator"),
        (["algorithm.grpo.kl_mode=penalty"], "kl_mode"),
        (["models.critic.source=student"], "PPO's role"),
        (
            [
                "algorithm.name=ppo",
                "models.critic.source=student",
                "models.critic.adapter.source=local",
                "models.critic.adapter.path=x",
            ],
            "takes lora",
        ),
        (["models.reward.source=tiny"], "unused"),
        (["algorithm.rewards=[{name: reward_model}]"], "models.reward is not configured"),
        (
            [
                "algorithm.rewards=[{name: reward_model}]",
                "models.reward.source=hub",
                "models.reward.model_id=o/m",
                "models.reward.revision=main",
            ],
            "mutable",
        ),
        (
            ["memory.placement=swap", "models.reference.source=student", "models.reference.quantization=nf4"],
            "swap is refused for the quantized models.reference",
        ),
    ],
)
def test_refusals(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, *overrides)


def test_shared_backbone_ppo_needs_no_teacher_and_keeps_the_critic_on_the_base(tmp_path: Path) -> None:
    config = _load(tmp_path, "algorithm.name=ppo", "models.runtime=shared_backbone")
    assert config.models.teacher is None and config.models.critic is not None
    with pytest.raises(ConfigError, match="critic must be source 'student'"):
        _load(tmp_path, "algorithm.name=ppo", "models.runtime=shared_backbone", "models.critic.source=local",
              "models.critic.path=x")  # fmt: skip
    with pytest.raises(ConfigError, match=r"needs models\.teacher"):
        _load(tmp_path, "algorithm.name=opd", "models.runtime=shared_backbone")
