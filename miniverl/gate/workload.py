"""The deterministic workload shared by the equivalence gate and the runtime benchmark.

Eight synthetic trajectories (prompt + response token ids, no downloads). Their lengths
``SEED_LENGTHS`` are spread like the seed's benchmark (60-400 tokens) and chosen so that length
buckets of 2, 4 and 8 add exactly the seed's padding (270, 616 and 1,636 tokens). The selected
positions are the response positions; token weights are 1 except every fifth response token (0.5),
so that weighting is exercised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from miniverl.canonical import sha256_json
from miniverl.config.schema import ModelsSection
from miniverl.runtime.base import RoleRuntime, SequenceRows

SEED_LENGTHS = (176, 60, 400, 145, 274, 98, 276, 135)


@dataclass(frozen=True)
class Workload:
    rows: SequenceRows
    token_weights: tuple[tuple[float, ...], ...]

    @property
    def lengths(self) -> list[int]:
        return [len(x) for x in self.rows.input_ids]

    def digest(self) -> str:
        return sha256_json(
            {
                "input_ids": [list(x) for x in self.rows.input_ids],
                "selected_positions": [list(x) for x in self.rows.selected_positions],
                "token_weights": [list(x) for x in self.token_weights],
            }
        )


def synthetic_workload(vocab_size: int, *, trajectories: int = 8, scale: float = 1.0, seed: int = 0) -> Workload:
    """``trajectories`` rows; lengths ``SEED_LENGTHS`` (cycled) times ``scale``, at least 6 tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[tuple[int, ...]] = []
    positions: list[tuple[int, ...]] = []
    weights: list[tuple[float, ...]] = []
    for i in range(trajectories):
        length = max(6, round(SEED_LENGTHS[i % len(SEED_LENGTHS)] * scale) + i // len(SEED_LENGTHS))
        prompt = max(2, min(length // 3, 16 + (7 * i) % 24))
        tokens = torch.randint(3, vocab_size, (length,), generator=gen).tolist()
        ids.append(tuple(tokens))
        pos = tuple(range(prompt - 1, length - 1))  # hidden at p predicts token p + 1 (the response)
        positions.append(pos)
        weights.append(tuple(0.5 if k % 5 == 4 else 1.0 for k in range(len(pos))))
    return Workload(rows=SequenceRows(tuple(ids), tuple(positions)), token_weights=tuple(weights))


def set_student_init(runtime: RoleRuntime, *, seed: int, b_scale: float = 0.01) -> str:
    """Overwrite the student LoRA with a seeded init keyed by parameter name; returns its digest.

    ``B`` is small but nonzero so that ``A`` gets gradients too (peft starts at ``B = 0``).
    """
    digest = hashlib.sha256()
    with torch.no_grad():
        for k, (name, param) in enumerate(sorted(runtime.named_trainable_parameters())):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + k)
            fan_in = param.shape[1] if param.dim() == 2 else param.numel()
            scale = b_scale if "lora_B" in name else fan_in**-0.5
            value = torch.randn(tuple(param.shape), generator=gen, dtype=torch.float32) * scale
            param.copy_(value.to(dtype=param.dtype, device=param.device))
            digest.update(name.encode())
            digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def models_section(
    runtime: str, *, student: dict[str, Any], adapter: dict[str, Any], dtype: str, quantization: str
) -> ModelsSection:
    """The gate/bench model config: a LoRA student and a teacher = the student's base + a pinned adapter."""
    return ModelsSection.model_validate(
        {
            "runtime": runtime,
            "dtype": dtype,
            "attn_implementation": "eager",
            "student": {**student, "quantization": quantization, "lora": {"r": 16, "alpha": 32, "dropout": 0.0}},
            "teacher": {"source": "student", "quantization": quantization, "adapter": adapter},
        }
    )


@contextmanager
def deterministic_torch() -> Iterator[None]:
    """Deterministic algorithms for the block (warn-only), restoring the previous setting."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)
