"""The rows a role runtime is asked about and the padded batches it answers in: the types that the runtime
interface (:mod:`~miniverl.runtime.base`) and the physical batching (:mod:`~miniverl.runtime.batching`) share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

BatchSize = int | Literal["auto"]


@dataclass(frozen=True)
class SequenceRows:
    """Unpadded token sequences plus, per sequence, the positions whose hidden states are wanted.

    Position ``p`` of a row is the hidden state that predicts token ``p + 1``: for a prompt of
    length ``P`` and a response of length ``R``, the response tokens are predicted from
    positions ``P - 1 .. P + R - 2``.
    """

    input_ids: tuple[tuple[int, ...], ...]
    selected_positions: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.selected_positions):
            raise ValueError("input_ids and selected_positions must have one entry per row")
        for ids, positions in zip(self.input_ids, self.selected_positions, strict=True):
            if any(p < 0 or p >= len(ids) for p in positions):
                raise ValueError("selected position outside its row")

    @property
    def selected_counts(self) -> tuple[int, ...]:
        return tuple(len(p) for p in self.selected_positions)


@dataclass(frozen=True)
class PhysicalBatch:
    """One padded forward's result: its row indices and their selected hidden states, flattened."""

    rows: tuple[int, ...]
    hidden: torch.Tensor  # [sum(selected of these rows), H], rows in ``rows`` order
    counts: tuple[int, ...]  # selected positions per row, same order
    padded_tokens: int
