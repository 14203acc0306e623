"""PPO's critic: a trainable LoRA on a causal-LM backbone plus a scalar value head.

The value of position ``p`` is ``head(h_p)``, with ``h_p`` the final-normed hidden state that
predicts token ``p + 1`` (the same positions the actor's log-probs are read at, as in verl, whose
critic reads ``values[:, -response_length - 1 : -1]``). The head is fp32 and seeded from the config
(``algorithm.ppo.critic_head_seed``), so its initialization does not consume the global RNG.

On disk a critic is a directory: a standard PEFT adapter (``adapter_config.json`` +
``adapter_model.safetensors``) and ``value_head.safetensors`` (``weight [1, H]``, ``bias [1]``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from miniverl.canonical import fsync_tree
from miniverl.outputs import write_safetensors
from miniverl.runtime.handles import save_peft_adapter
from miniverl.runtime.loading import inner_causal_lm

CRITIC_ADAPTER = "critic"
VALUE_HEAD = "value_head.safetensors"


def build_value_head(model: Any, *, seed: int, device: torch.device) -> torch.nn.Linear:
    """``Linear(H, 1)`` in fp32: weight ~ N(0, 1/H) from its own generator, bias 0."""
    hidden = int(inner_causal_lm(model).config.hidden_size)
    head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(1, hidden, generator=generator, dtype=torch.float32) / hidden**0.5)
        head.bias.zero_()
    return head.to(device).requires_grad_(True)


def values_from_hidden(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """``[N, H]`` selected hidden states -> ``[N]`` fp32 values."""
    out: torch.Tensor = head(hidden.to(head.weight.dtype)).squeeze(-1)
    return out


def named_critic_parameters(peft_model: Any, head: torch.nn.Linear) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """The critic's trainable tensors: its LoRA (names carry ``.critic.``) and ``value_head.*``."""
    for name, param in peft_model.named_parameters():
        if "lora_" in name and f".{CRITIC_ADAPTER}." in name:
            yield name, param
    for name, param in head.named_parameters():
        yield f"value_head.{name}", param


def save_critic(peft_model: Any, head: torch.nn.Linear, directory: str | os.PathLike[str]) -> None:
    """Write the critic as its own directory: the PEFT adapter plus ``value_head.safetensors``."""
    target = Path(directory)
    save_peft_adapter(peft_model, CRITIC_ADAPTER, target)
    tensors = {
        "weight": head.weight.detach().to("cpu").contiguous(),
        "bias": head.bias.detach().to("cpu").contiguous(),
    }
    write_safetensors(target / VALUE_HEAD, tensors, metadata={"format": "pt"})
    fsync_tree(target)


class CriticRole:
    """PPO's critic role on a runtime: the value head and the critic's tensors, over ``_critic_model``
    (a separate model in ``dual_model``, the shared base in ``shared_backbone``)."""

    _value_head: torch.nn.Linear | None

    def _critic_model(self) -> Any:
        raise NotImplementedError

    @property
    def value_head(self) -> torch.nn.Linear:
        if self._value_head is None:
            raise KeyError("runtime has no critic role (models.critic)")
        return self._value_head

    def named_critic_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        yield from named_critic_parameters(self._critic_model(), self.value_head)

    def critic_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named_critic_parameters()]

    def save_critic(self, directory: str) -> None:
        save_critic(self._critic_model(), self.value_head, directory)
