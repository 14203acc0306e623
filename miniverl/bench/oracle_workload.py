"""The runtime-benchmark workload made of the eight RecoveryBench oracle trajectories (``--rows oracle-sql``).

The seed's benchmark ran on "eight deterministic SQLite RecoveryBench oracle trajectories". These
are ours (:func:`miniverl.data.sqlite_recovery.oracle_trajectories`, pinned by sha256): each row
is the prompt's tokens followed by the oracle response's tokens, and the selected positions are
the response's (the hidden state at ``p`` predicts token ``p + 1``), with the synthetic
workload's token weights (0.5 on every fifth response token).

Tokens: with a tokenizer (the embedded SmolLM2 has one) the rows are its tokens. The random-weight
models (``tiny``, ``qwen3-0.6b-shape``) have none offline, so the text is cut into the pieces of a
Qwen2-style pre-tokenizer split (letters with one leading non-letter, single digits, punctuation
runs, whitespace runs) and each piece is hashed into the vocabulary. A real BPE merges no further
than those pieces, so the lengths are a lower bound of Qwen3's; throughput does not depend on
the token values.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

from miniverl.data.sqlite_recovery import ORACLE_TRAJECTORIES_SHA256, oracle_trajectories
from miniverl.gate.workload import Workload
from miniverl.runtime.base import SequenceRows
from miniverl.runtime.batching import padding_tokens, plan_physical_batches

ROW_SOURCES = ("synthetic", "oracle-sql")
#: Padding tokens of the seed's benchmark (Consumer Runtime v1) at physical batch 2, 4 and 8.
SEED_PADDING: dict[str, int] = {"2": 270, "4": 616, "8": 1636}

Encoder = Callable[[str], list[int]]

_PIECE = re.compile(r"[^\r\n\w]?[^\W\d_]+|\d| ?[^\s\w]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+|.", re.DOTALL)


def pieces(text: str) -> list[str]:
    """``text`` cut like a Qwen2-style pre-tokenizer; the pieces join back to ``text``."""
    return _PIECE.findall(text)


def hashed_encoder(vocab_size: int, *, reserved: int = 3) -> Encoder:
    """An encoder with no vocabulary file: each piece's sha256, modulo the vocab, above ``reserved`` ids."""
    if vocab_size <= reserved:
        raise ValueError(f"vocab_size must exceed {reserved}")

    def encode(text: str) -> list[int]:
        return [
            reserved + int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "big") % (vocab_size - reserved)
            for p in pieces(text)
        ]

    return encode


def oracle_workload(encode: Encoder) -> Workload:
    """The eight oracle trajectories as token rows: prompt then response, the response positions selected."""
    ids: list[tuple[int, ...]] = []
    positions: list[tuple[int, ...]] = []
    weights: list[tuple[float, ...]] = []
    for trajectory in oracle_trajectories():
        prompt, response = encode(trajectory.prompt + "\n"), encode(trajectory.response)
        if not prompt or not response:
            raise ValueError(f"oracle trajectory {trajectory.prompt_id} encodes to no tokens")
        tokens = tuple(prompt + response)
        selected = tuple(range(len(prompt) - 1, len(tokens) - 1))
        ids.append(tokens)
        positions.append(selected)
        weights.append(tuple(0.5 if k % 5 == 4 else 1.0 for k in range(len(selected))))
    return Workload(rows=SequenceRows(tuple(ids), tuple(positions)), token_weights=tuple(weights))


def padding_by_batch(lengths: Sequence[int], batches: Sequence[int] = (2, 4, 8)) -> dict[str, int]:
    """Padding tokens that length buckets of each size add (the seed's table: 2, 4 and all 8 rows)."""
    return {str(k): padding_tokens(lengths, plan_physical_batches(lengths, k)) for k in batches}


def padding_note(source: str, lengths: Sequence[int], tokenizer: str) -> str:
    """The bench.md note: this workload's padding beside the seed's."""
    ours = padding_by_batch(lengths)
    cells = ", ".join(f"batch {k}: {ours[k]:,} (seed {SEED_PADDING[k]:,})" for k in ours)
    where = (
        f"the 8 RecoveryBench oracle trajectories (sha256 {ORACLE_TRAJECTORIES_SHA256[:16]}), tokens: {tokenizer}"
        if source == "oracle-sql"
        else "synthetic rows with the seed's length profile"
    )
    return f"Rows: {where}; lengths {list(lengths)}. Padding tokens by length bucket: {cells}.\n"
