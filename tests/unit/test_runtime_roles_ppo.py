"""Runtime roles added for PPO and memory placement: the critic (both runtimes) and dual_model swap."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from miniverl.config.schema import ModelsSection
from miniverl.errors import ConfigError
from miniverl.gate.models import RandomModelLoader, write_random_adapter
from miniverl.runtime import SequenceRows, build_runtime
from miniverl.runtime.critic import values_from_hidden

CPU = torch.device("cpu")
ROWS = SequenceRows(input_ids=((5, 6, 7, 8, 9), (11, 12, 13)), selected_positions=((2, 3), (1,)))

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _models(runtime: str, **extra: Any) -> ModelsSection:
    return ModelsSection.model_validate(
        {
            "runtime": runtime,
            "student": {"source": "local", "path": "tiny", "lora": {"r": 4, "alpha": 8}},
            "critic": {"source": "student"},
            **extra,
        }
    )


@pytest.mark.parametrize("runtime", ["dual_model", "shared_backbone"])
def test_critic_role_is_trainable_and_separate_from_the_actor(runtime: str) -> None:
    rt = build_runtime(_models(runtime), device=CPU, loader=RandomModelLoader("tiny"), critic_seed=5)
    actor = dict(rt.named_trainable_parameters())
    critic = dict(rt.named_critic_parameters())
    assert actor and critic and not set(actor) & set(critic)
    assert all(".student." in n for n in actor)
    assert {"value_head.weight", "value_head.bias"} <= set(critic)
    assert all(p.requires_grad for p in critic.values())
    with rt.use("critic") as handle:
        values = values_from_hidden(rt.value_head, handle.selected_hidden(ROWS, trajectory_batch_size=2))
    assert values.shape == (3,) and values.dtype == torch.float32
    values.sum().backward()
    assert all(actor[n].grad is None for n in actor)  # the critic's loss never reaches the actor
    assert rt.value_head.weight.grad is not None
    lora_b = [p for n, p in critic.items() if "lora_B" in n]
    assert any(p.grad is not None and float(p.grad.abs().max()) > 0 for p in lora_b)  # reaches the critic LoRA
    head_again = build_runtime(_models(runtime), device=CPU, loader=RandomModelLoader("tiny"), critic_seed=5)
    assert head_again.value_head.weight.equal(rt.value_head.weight)  # seeded, not from the global RNG


def test_dual_swap_moves_frozen_roles_only_inside_their_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    models = ModelsSection.model_validate(
        {
            "student": {"source": "local", "path": "tiny", "lora": {"r": 4, "alpha": 8}},
            "reference": {"source": "student"},
        }
    )
    rt = build_runtime(models, device=CPU, loader=RandomModelLoader("tiny"), placement="swap")
    moves: list[str] = []
    with rt.use("reference") as handle:
        real_to = handle.model.to
    monkeypatch.setattr(handle.model, "to", lambda device: moves.append(str(device)) or real_to("cpu"))
    moves.clear()
    rt.swap_transfers = 0  # type: ignore[attr-defined]
    with rt.use("reference") as ref:
        with rt.use("reference"):  # nested use of the active role moves nothing
            pass
        ref.selected_hidden(ROWS, trajectory_batch_size=1)
        assert moves == ["cpu"]  # moved to the device (here the CPU) on entry only
    assert moves == ["cpu", "cpu"] and rt.swap_transfers == 2  # type: ignore[attr-defined]
    with rt.use("student"):
        pass
    assert rt.swap_transfers == 2  # type: ignore[attr-defined]  # the student is resident


def test_swap_is_refused_where_it_cannot_work(tmp_path) -> None:
    from miniverl.runtime.shared import check_shared_models

    sha = write_random_adapter(RandomModelLoader("tiny").config, tmp_path / "a", seed=1)
    shared = ModelsSection.model_validate(
        {
            "runtime": "shared_backbone",
            "student": {"source": "local", "path": "tiny"},
            "teacher": {
                "source": "student",
                "adapter": {"source": "local", "path": str(tmp_path / "a"), "sha256": sha},
            },
        }
    )
    with pytest.raises(ConfigError, match="swap is refused for a shared backbone"):
        check_shared_models(shared, "swap")


def test_shared_reference_can_be_the_frozen_base() -> None:
    """``reference: {source: student}`` without an adapter: the base with every adapter disabled."""
    models = ModelsSection.model_validate(
        {
            "runtime": "shared_backbone",
            "student": {"source": "local", "path": "tiny", "lora": {"r": 4, "alpha": 8}},
            "reference": {"source": "student"},
            "critic": {"source": "student"},
        }
    )
    rt = build_runtime(models, device=CPU, loader=RandomModelLoader("tiny"))
    assert rt.role_manifest()["roles"]["reference"]["frozen_base"] is True
    named = dict(rt.named_trainable_parameters())
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for name, p in [*named.items(), *rt.named_critic_parameters()]:
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        with rt.use("reference") as ref:
            base = ref.selected_hidden(ROWS, trajectory_batch_size=2)
        with rt.use("student") as student:
            trained = student.selected_hidden(ROWS, trajectory_batch_size=2)
        with rt.use("critic") as critic:
            critic_hidden = critic.selected_hidden(ROWS, trajectory_batch_size=2)
        assert not base.equal(trained) and not base.equal(critic_hidden)
        for name, p in [*named.items(), *rt.named_critic_parameters()]:
            if "lora_B" in name:
                p.zero_()
        with rt.use("student") as student:
            assert student.selected_hidden(ROWS, trajectory_batch_size=2).equal(base)  # B = 0: exactly the base
    assert all(p.requires_grad for p in named.values())  # the switch left the actor trainable
