"""Repeated passes (issue #19): the config contract, the shared mini-batch split, the optimizer wrapper's
counts and the handoff of GRPO/PPO epochs and mini-batches (actor and critic) to verl's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.config.loader import load_config
from miniverl.errors import ConfigError
from miniverl.handoff.compiler import compile_plan_ir
from miniverl.handoff.emit import emit_verl_config
from miniverl.handoff.ir import GrpoIR, PpoIR
from miniverl.handoff.rules import HandoffRefusal
from miniverl.training.algorithms.base import TrainedParameters
from miniverl.training.update import mini_batches, pass_order_seed
from tests.unit.test_config_ppo import BASE
from tests.unit.test_handoff_compiler import _config, _plan
from tests.unit.test_handoff_compiler_v2 import _ppo


def _load(tmp_path: Path, *overrides: str):
    path = tmp_path / "c.yaml"
    path.write_text(BASE)  # 2 prompts x 4 samples per cycle
    return load_config(path, list(overrides))


def test_grpo_defaults_are_one_pass_of_one_mini_batch(tmp_path: Path) -> None:
    config = _load(tmp_path)
    grpo = config.algorithm.grpo
    assert (grpo.ppo_epochs, grpo.mini_batches, grpo.shuffle_mini_batches) == (1, 1, True)
    assert config.train.gradient_accumulation_steps == 8


def test_grpo_mini_batches_set_the_accumulation_to_one_mini_batch(tmp_path: Path) -> None:
    config = _load(tmp_path, "algorithm.grpo.ppo_epochs=2", "algorithm.grpo.mini_batches=2")
    assert config.train.gradient_accumulation_steps == 4  # one prompt group of 4 samples
    again = _load(tmp_path, "algorithm.grpo.mini_batches=2", "train.gradient_accumulation_steps=4")
    assert again.train.gradient_accumulation_steps == 4


def test_critic_settings_default_to_the_actors(tmp_path: Path) -> None:
    ppo = _load(tmp_path, "algorithm.name=ppo", "algorithm.ppo.ppo_epochs=3", "algorithm.ppo.mini_batches=2")
    assert ppo.algorithm.ppo.critic_ppo_epochs is None and ppo.algorithm.ppo.critic_epoch_count == 3
    assert ppo.algorithm.ppo.critic_mini_batch_count == 2
    own = _load(
        tmp_path, "algorithm.name=ppo", "algorithm.ppo.critic_ppo_epochs=1", "algorithm.ppo.critic_mini_batches=4"
    )
    assert (own.algorithm.ppo.critic_epoch_count, own.algorithm.ppo.critic_mini_batch_count) == (1, 4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.grpo.mini_batches=3"],
            r"algorithm\.grpo\.mini_batches \(3\) must divide rollout\.prompts_per_cycle",
        ),
        (["algorithm.grpo.mini_batches=2", "train.gradient_accumulation_steps=8"], "one GRPO mini-batch"),
        (["algorithm.grpo.ppo_epochs=0"], "ppo_epochs"),
        (["algorithm.grpo.mini_batches=0"], "mini_batches"),
        (["algorithm.grpo.shuffle_mini_batches=maybe"], "shuffle_mini_batches"),
        (["algorithm.name=ppo", "algorithm.ppo.critic_mini_batches=3"], r"critic_mini_batches \(3\) must divide"),
        (["algorithm.name=ppo", "algorithm.ppo.critic_ppo_epochs=0"], "critic_ppo_epochs"),
        (["algorithm.name=ppo", "algorithm.ppo.critic_mini_batches=0"], "critic_mini_batches"),
    ],
)
def test_multipass_refusals(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(tmp_path, *overrides)


def test_mini_batches_keep_units_whole_and_replay_from_the_seed() -> None:
    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    seed = pass_order_seed("grpo", 0, 1, 1)
    first = mini_batches(groups, 2, seed, shuffle=True)
    assert first == mini_batches(groups, 2, seed, shuffle=True)  # resume replays the order
    assert sorted(i for m in first for i in m) == list(range(8)) and [len(m) for m in first] == [4, 4]
    for mini in first:  # each group whole, in its own order
        assert all(mini[k + 1] == mini[k] + 1 and mini[k] % 2 == 0 for k in range(0, len(mini), 2))
    orders = {
        tuple(map(tuple, mini_batches(groups, 4, pass_order_seed("grpo", 0, 1, e), shuffle=True))) for e in range(8)
    }
    assert len(orders) > 1  # passes are reshuffled
    assert mini_batches(groups, 2, seed, shuffle=False) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert pass_order_seed("grpo", 0, 1, 1) != pass_order_seed("grpo", 0, 1, 0) != pass_order_seed("grpo", 1, 1, 0)
    with pytest.raises(ValueError, match="cannot make 3 equal mini-batches"):
        mini_batches(groups, 3, seed, shuffle=True)


def test_the_optimizer_wrapper_counts_steps_passes_and_mini_batches() -> None:
    weight = torch.nn.Parameter(torch.ones(2))
    trained = TrainedParameters(
        [("w", weight)], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, max_grad_norm=None
    )

    def step() -> None:
        (weight**2).sum().backward()
        trained.step()

    trained.begin_update()
    for _ in range(2):
        trained.begin_pass()
        for _ in range(3):
            step()
    assert trained.update_counts("actor") == {"actor/updates": 6.0, "actor/passes": 2.0, "actor/mini_batches": 3.0}
    trained.begin_update()
    step()  # a single step without begin_pass is one pass of one mini-batch
    assert trained.update_counts("actor") == {"actor/updates": 1.0, "actor/passes": 1.0, "actor/mini_batches": 1.0}
    trained.begin_update()
    trained.begin_pass()
    step()
    trained.begin_pass()
    step()
    step()
    with pytest.raises(RuntimeError, match="different step counts"):
        trained.update_counts("critic")


def _grpo_verl(**changes: Any) -> tuple[GrpoIR, dict[str, Any]]:
    config = _config(**changes)
    ir = compile_plan_ir(_plan(config), config)
    assert isinstance(ir.algorithm, GrpoIR)
    return ir.algorithm, emit_verl_config(ir)


def test_grpo_epochs_and_mini_batches_reach_verls_actor() -> None:
    algo, verl = _grpo_verl(
        algorithm__grpo__ppo_epochs=2, algorithm__grpo__mini_batches=2, algorithm__grpo__shuffle_mini_batches=False
    )
    actor = verl["actor_rollout_ref"]["actor"]
    assert (algo.ppo_epochs, algo.mini_batch_prompts) == (2, 1)
    assert verl["data"]["train_batch_size"] == 2
    assert (actor["ppo_epochs"], actor["ppo_mini_batch_size"], actor["shuffle"]) == (2, 1, False)
    # verl's micro-batches divide the mini-batch (1 prompt x 4 samples)
    assert 4 % actor["ppo_micro_batch_size_per_gpu"] == 0
    _, single = _grpo_verl()
    assert single["actor_rollout_ref"]["actor"]["ppo_epochs"] == 1
    assert single["actor_rollout_ref"]["actor"]["ppo_mini_batch_size"] == 2


def test_ppo_critic_epochs_and_mini_batches_reach_verls_critic() -> None:
    config = _ppo(algorithm__ppo__critic_ppo_epochs=3, algorithm__ppo__critic_mini_batches=4)
    ir = compile_plan_ir(_plan(config), config)
    assert isinstance(ir.algorithm, PpoIR)
    verl = emit_verl_config(ir)
    actor, critic = verl["actor_rollout_ref"]["actor"], verl["critic"]
    assert (actor["ppo_epochs"], actor["ppo_mini_batch_size"]) == (2, 2)
    assert (critic["ppo_epochs"], critic["ppo_mini_batch_size"]) == (3, 1)
    assert critic["cliprange_value"] == 0.5
    # one micro-batch size for both: it divides the actor's 4 and the critic's 2 trajectories per mini-batch
    assert critic["ppo_micro_batch_size_per_gpu"] == actor["ppo_micro_batch_size_per_gpu"] == 2
    defaults = _ppo()
    plain = emit_verl_config(compile_plan_ir(_plan(defaults), defaults))["critic"]
    assert (plain["ppo_epochs"], plain["ppo_mini_batch_size"]) == (2, 2)  # null: the actor's


def test_a_critic_mini_batch_that_splits_a_group_is_refused_by_name() -> None:
    config = _ppo(algorithm__ppo__critic_mini_batches=8)  # 8 trajectories fit, 4 prompt groups do not
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == "critic_mini_batch_splits_groups"
    assert "8 critic mini-batches" in str(caught.value)
