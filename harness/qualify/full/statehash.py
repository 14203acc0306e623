"""The harness's own sha256 of checkpoint state files, and the judges' comparisons of them.

Run side (while the work dir exists): :func:`write_state_hashes` hashes every file a checkpoint's
``checkpoint.json`` lists (adapter, optimizer, RNG, critic, ...) and, where a judge needs them, each adapter
tensor's byte range (the safetensors header parsed without torch), into one small evidence file,
``state-hashes.json``.

Judge side: :func:`read_state_hashes` reads it back strictly (None when it is not one); :func:`same_files`
compares two checkpoints by the harness's hashes; :func:`product_agrees` holds the product's ``checkpoint.json``
(kept in the evidence) to the harness's hashes, so a product that lies about its own files fails;
:func:`adapter_moved` says from per-tensor digests whether an update changed the adapter. Nothing on the judge
side raises on bad content.
"""

from __future__ import annotations

import functools
import hashlib
import math
import stat
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.core.errors import HarnessError, RecordError
from harness.core.jsonio import canonical_bytes, loads_strict
from harness.core.records import (
    DTYPE_BYTES,
    CheckpointHashes,
    FileHash,
    OptimizerSteps,
    StateHashes,
    StepTally,
    TensorDigest,
)
from harness.core.records import (
    KIND_STATE_HASHES as KIND,
)
from harness.qualify.full.reading import count, file_sha256, read_json

CHUNK = 1 << 20
HEADER_LIMIT_BYTES = 100 << 20  # what the safetensors format itself allows for a header
ZERO_DIGEST_LIMIT_BYTES = 1 << 28  # a tensor larger than this is never taken for the all-zero init state


class StateHashError(HarnessError):
    """A checkpoint the harness could not hash (one line, recorded in the evidence as the reason)."""


# ------------------------------------------------------------------------------------------------ run side


def _regular(path: Path, root: Path) -> None:
    """``path`` is a regular file under ``root`` with no symlink between them."""
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            mode = current.lstat().st_mode
        except OSError:
            raise StateHashError(f"{path.relative_to(root).as_posix()} does not exist") from None
        if stat.S_ISLNK(mode):
            raise StateHashError(f"{current.relative_to(root).as_posix()} is a symlink")
    if not stat.S_ISREG(path.lstat().st_mode):
        raise StateHashError(f"{path.relative_to(root).as_posix()} is not a regular file")


def _stream(handle: Any, length: int, digest: Any) -> None:
    left = length
    while left:
        chunk = handle.read(min(CHUNK, left))
        if not chunk:
            raise StateHashError("file ended inside a tensor")
        digest.update(chunk)
        left -= len(chunk)


def file_hash(path: Path) -> FileHash:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return FileHash(bytes=size, sha256=digest.hexdigest())


def _entries(header: Any, data_bytes: int, name: str) -> list[tuple[str, str, list[int], int, int]]:
    if not isinstance(header, dict):
        raise StateHashError(f"{name}: safetensors header is not a JSON object")
    out = []
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise StateHashError(f"{name}: tensor {tensor[:80]!r} is not a dtype/shape/data_offsets entry")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES or not isinstance(shape, list) or not all(count(d) is not None for d in shape):
            raise StateHashError(f"{name}: tensor {tensor[:80]!r} has dtype {str(dtype)[:20]!r} or a bad shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(count(o) is not None for o in offsets)):
            raise StateHashError(f"{name}: tensor {tensor[:80]!r} has bad data_offsets")
        begin, end = offsets
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        if not begin <= end <= data_bytes or end - begin != size:
            raise StateHashError(f"{name}: tensor {tensor[:80]!r} byte range {begin}..{end} does not fit its shape")
        out.append((tensor, dtype, shape, begin, end))
    return out


def tensor_digests(path: Path) -> dict[str, TensorDigest]:
    """Per-tensor digests of a safetensors file: an 8-byte little-endian header length, a JSON header
    (tensor -> dtype, shape, data_offsets into the data after it), then the raw bytes. Malformed: StateHashError."""
    name = path.name
    total = path.stat().st_size
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise StateHashError(f"{name}: shorter than a safetensors header length")
        (length,) = struct.unpack("<Q", raw)
        if length > HEADER_LIMIT_BYTES or 8 + length > total:
            raise StateHashError(f"{name}: safetensors header length {length} does not fit the file")
        try:
            header = loads_strict(handle.read(length), name)
        except (RecordError, ValueError, RecursionError) as exc:
            raise StateHashError(f"{name}: safetensors header is not strict JSON ({str(exc)[:120]})") from None
        data_start = 8 + length
        out: dict[str, TensorDigest] = {}
        for tensor, dtype, shape, begin, end in _entries(header, total - data_start, name):
            handle.seek(data_start + begin)
            digest = hashlib.sha256()
            _stream(handle, end - begin, digest)
            out[tensor] = TensorDigest(dtype=dtype, shape=shape, bytes=end - begin, sha256=digest.hexdigest())
    return out


def is_adapter(name: str) -> bool:
    return name.endswith("adapter_model.safetensors")


def is_optimizer(name: str) -> bool:
    return name.endswith("optimizer.safetensors")


# How each dtype an optimizer's step counter may have is unpacked (little-endian, one element).
STEP_FORMATS = {"F64": "<d", "F32": "<f", "F16": "<e", "I64": "<q", "I32": "<i", "U64": "<Q", "U32": "<I"}


def _step_value(raw: bytes, dtype: str) -> float:
    if dtype == "BF16":  # the high half of an F32
        (value,) = struct.unpack("<f", b"\0\0" + raw)
    else:
        (value,) = struct.unpack(STEP_FORMATS[dtype], raw)
    return float(value)


def optimizer_steps(data: bytes, name: str) -> OptimizerSteps:
    """The AdamW ``step`` counters of an optimizer safetensors file's bytes: the optimizer state is one tensor per
    ``state.<slot>.<key>``; each slot's ``step`` must be one number (a scalar), read here from the raw bytes, never
    through torch. StateHashError when the file is malformed or a step tensor is not one finite number."""
    if len(data) < 8:
        raise StateHashError(f"{name}: shorter than a safetensors header length")
    (length,) = struct.unpack("<Q", data[:8])
    if length > HEADER_LIMIT_BYTES or 8 + length > len(data):
        raise StateHashError(f"{name}: safetensors header length {length} does not fit the file")
    try:
        header = loads_strict(data[8 : 8 + length], name)
    except (RecordError, ValueError, RecursionError) as exc:
        raise StateHashError(f"{name}: safetensors header is not strict JSON ({str(exc)[:120]})") from None
    start = 8 + length
    slots: set[str] = set()
    values: dict[str, float] = {}
    for tensor, dtype, shape, begin, end in _entries(header, len(data) - start, name):
        slot, _, key = tensor.rpartition(".")
        slots.add(slot)
        if key != "step":
            continue
        if any(dim != 1 for dim in shape) or (dtype not in STEP_FORMATS and dtype != "BF16"):
            raise StateHashError(f"{name}: step tensor {tensor[:80]!r} is {dtype} {shape}, not one number")
        value = _step_value(data[start + begin : start + end], dtype)
        if not math.isfinite(value):
            raise StateHashError(f"{name}: step tensor {tensor[:80]!r} is not finite")
        values[slot] = value
    if len(values) != len(slots):
        raise StateHashError(f"{name}: {len(slots) - len(values)} of {len(slots)} parameter slots have no step tensor")
    tally = [StepTally(value=v, slots=sum(1 for x in values.values() if x == v)) for v in sorted(set(values.values()))]
    try:
        return OptimizerSteps(sha256=hashlib.sha256(data).hexdigest(), slots=len(slots), steps=tally)
    except ValidationError as exc:
        raise StateHashError(f"{name}: step counters cannot be recorded: {str(exc.errors()[0]['msg'])[:160]}") from None


def hash_checkpoint(directory: Path, *, tensors: bool = False, steps: bool = False) -> CheckpointHashes:
    """Hash every file ``directory/checkpoint.json`` lists, with ``tensors`` each adapter's tensors (about
    80 kB of digests per SmolLM2 adapter: kept only where a judge decides parameter change from them), and with
    ``steps`` each optimizer file's AdamW step counters, read from the very bytes hashed (a few bytes each where
    the file is megabytes: kept instead of the file). StateHashError if the checkpoint is malformed, a listed
    file is missing or a symlink, or a safetensors header is bad."""
    listing = directory / "checkpoint.json"
    _regular(listing, directory)
    data = listing.read_bytes()
    try:
        doc = loads_strict(data, "checkpoint.json")
    except (RecordError, ValueError, RecursionError) as exc:
        raise StateHashError(f"checkpoint.json is not strict JSON ({str(exc)[:120]})") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    step = count(doc.get("step")) if isinstance(doc, dict) else None
    if not isinstance(files, dict) or not files or step is None:
        raise StateHashError("checkpoint.json lists no files or no step")
    hashed: dict[str, FileHash] = {}
    tables: dict[str, dict[str, TensorDigest]] = {}
    counters: dict[str, OptimizerSteps] = {}
    for name in sorted(files):
        parts = name.split("/")
        if name.startswith("/") or any(p in {"", ".", ".."} for p in parts):
            raise StateHashError(f"checkpoint.json lists {name[:80]!r}, not a relative path inside the checkpoint")
        path = directory.joinpath(*parts)
        _regular(path, directory)
        if steps and is_optimizer(name):
            raw = path.read_bytes()  # one read: the counters are those of the bytes whose sha256 is recorded
            counters[name] = optimizer_steps(raw, name)
            hashed[name] = FileHash(bytes=len(raw), sha256=counters[name].sha256)
        else:
            hashed[name] = file_hash(path)
        if tensors and is_adapter(name):
            tables[name] = tensor_digests(path)
    try:
        return CheckpointHashes(
            step=step,
            checkpoint_json_sha256=hashlib.sha256(data).hexdigest(),
            files=hashed,
            tensors=tables,
            optimizer_steps=counters,
        )
    except ValidationError as exc:
        raise StateHashError(f"checkpoint cannot be recorded: {str(exc.errors()[0]['msg'])[:160]}") from None


Taken = CheckpointHashes | str  # a checkpoint's hashes, or why the harness could not hash it


def take(directory: Path, *, tensors: bool = False, steps: bool = False) -> Taken | None:
    """Hash one checkpoint directory now (None when it has no checkpoint.json: the judge sees it missing)."""
    if not (directory / "checkpoint.json").exists():
        return None
    try:
        return hash_checkpoint(directory, tensors=tensors, steps=steps)
    except StateHashError as exc:
        return str(exc)[:300]
    except OSError as exc:  # its message would name a local path: only the reason is recorded
        return f"cannot read the checkpoint: {exc.strerror or type(exc).__name__}"


def write_taken(path: Path, taken: dict[str, Taken | None]) -> Path:
    """Write labelled hashes (canonical JSON); one that could not be hashed goes under ``refused`` with the reason
    (the judge fails on it), a missing one is left out."""
    record = StateHashes(
        kind=KIND,
        schema_version=1,
        checkpoints={label: t for label, t in taken.items() if isinstance(t, CheckpointHashes)},
        refused={label: t for label, t in taken.items() if isinstance(t, str)},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(canonical_bytes(record.model_dump(mode="json")) + b"\n")
    return path


def write_state_hashes(path: Path, checkpoints: dict[str, Path], *, tensors: bool = False) -> Path:
    """Hash each labelled checkpoint directory now, into ``path`` (:func:`write_taken`)."""
    return write_taken(path, {label: take(d, tensors=tensors) for label, d in checkpoints.items()})


# ---------------------------------------------------------------------------------------------- judge side


def read_state_hashes(path: Path | None) -> StateHashes | None:
    doc = read_json(path)
    if doc is None:
        return None
    try:
        return StateHashes.model_validate(doc)
    except (ValidationError, RecordError, ValueError):
        return None


def checkpoint(hashes: StateHashes | None, label: str) -> tuple[CheckpointHashes | None, str]:
    """The labelled checkpoint's hashes, or None and why."""
    if hashes is None:
        return None, "state-hashes.json missing or not a harness state-hashes record"
    if label in hashes.refused:
        return None, f"the harness could not hash checkpoint {label}: {hashes.refused[label][:160]}"
    found = hashes.checkpoints.get(label)
    return found, "" if found is not None else f"the harness hashed no checkpoint {label}"


def same_files(
    hashes: StateHashes | None, a: str, b: str, names: Iterable[str], *, step: int | None = None
) -> tuple[bool, str]:
    """Checkpoints ``a`` and ``b`` (labels) are of the same step (``step`` when given) and the harness's sha256
    of each named file is equal in both."""
    ca, why_a = checkpoint(hashes, a)
    cb, why_b = checkpoint(hashes, b)
    if ca is None or cb is None:
        return False, why_a or why_b
    wanted = list(names)
    missing = [n for n in wanted if n not in ca.files or n not in cb.files]
    differ = [n for n in wanted if n in ca.files and n in cb.files and ca.files[n].sha256 != cb.files[n].sha256]
    steps_ok = ca.step == cb.step and (step is None or ca.step == step)
    others = sorted(n for n in set(ca.files) | set(cb.files) if n not in wanted and ca.files.get(n) != cb.files.get(n))
    return not missing and not differ and steps_ok, (
        f"harness sha256 of {a} vs {b} (steps {ca.step}, {cb.step}{'' if step is None else f'; want {step}'}): "
        f"{len(wanted)} state files, missing {missing}, differing {differ}; other files differing "
        f"(informational) {others[:4]}"
    )


def product_agrees(hashes: StateHashes | None, label: str, listing: Path | None) -> tuple[bool, str]:
    """The kept ``checkpoint.json`` is the one the harness read (its sha256), and every file digest it states
    equals the harness's own sha256 of that file: the product's account of its checkpoint is true."""
    found, why = checkpoint(hashes, label)
    if found is None:
        return False, why
    doc = read_json(listing)
    files = doc.get("files") if doc is not None else None
    if listing is None or doc is None or not isinstance(files, dict):
        return False, f"checkpoint {label}: the kept checkpoint.json is missing or unreadable"
    bound = file_sha256(listing) == found.checkpoint_json_sha256
    stated = {n: (e.get("sha256"), e.get("bytes")) if isinstance(e, dict) else None for n, e in files.items()}
    actual = {n: (h.sha256, h.bytes) for n, h in found.files.items()}
    wrong = sorted(n for n in set(stated) | set(actual) if stated.get(n) != actual.get(n))
    ok = bound and not wrong and bool(actual)
    return ok, (
        f"checkpoint {label}: the kept checkpoint.json {'is' if bound else 'is NOT'} the one the harness hashed; "
        + (f"its digests of {wrong[:4]} differ from the harness's" if wrong else f"its {len(actual)} file digests "
           "equal the harness's")
    )  # fmt: skip


def listed_as_hashed(hashes: StateHashes | None, label: str, listing: Path | None, name: str) -> tuple[bool, str]:
    """The kept ``checkpoint.json`` is the one the harness read (its sha256) and lists file ``name`` at the sha256
    and size the harness took of it: what is judged of that file is of the checkpoint the product describes."""
    found, why = checkpoint(hashes, label)
    if found is None:
        return False, why
    doc = read_json(listing)
    files = doc.get("files") if doc is not None else None
    if listing is None or not isinstance(files, dict):
        return False, f"checkpoint {label}: the kept checkpoint.json is missing or unreadable"
    if file_sha256(listing) != found.checkpoint_json_sha256:
        return False, f"checkpoint {label}: the kept checkpoint.json is NOT the one the harness hashed"
    stated, hashed = files.get(name), found.files.get(name)
    said = (stated.get("sha256"), stated.get("bytes")) if isinstance(stated, dict) else None
    same = hashed is not None and said == (hashed.sha256, hashed.bytes)
    return same, f"checkpoint {label}: the kept checkpoint.json lists {name} " + (
        "at the harness's sha256" if same else "NOT as the harness hashed it"
    )


@functools.lru_cache(maxsize=256)
def _zero_digest(size: int) -> str:
    return hashlib.sha256(bytes(size)).hexdigest()


def all_zero(t: TensorDigest) -> bool:
    """The tensor's bytes are all zero (its digest is that of ``bytes`` zero bytes)."""
    return t.bytes <= ZERO_DIGEST_LIMIT_BYTES and t.sha256 == _zero_digest(t.bytes)


def _tensor_digests(hashes: StateHashes | None, label: str, name: str) -> tuple[dict[str, TensorDigest] | None, str]:
    """The per-tensor digests of file ``name`` in checkpoint ``label``, or None and why there are none."""
    held, why = checkpoint(hashes, label)
    if held is None:
        return None, why
    table = held.tensors.get(name)
    return (table, "") if table else (None, f"checkpoint {label}: no per-tensor digests of {name}")


def adapter_moved(hashes: StateHashes | None, before: str | None, after: str, name: str) -> tuple[bool, str]:
    """The adapter file ``name`` of checkpoint ``after`` has the same tensors (names, dtypes, shapes) as
    ``before`` and a different digest for at least one. ``before`` None: the initial LoRA, whose lora_B tensors
    are zero, so at least one lora_B tensor must hold a nonzero byte."""
    table, why = _tensor_digests(hashes, after, name)
    if table is None:
        return False, why
    if before is None:
        b_tensors = [t for n, t in table.items() if "lora_B" in n]
        moved = [n for n, t in table.items() if "lora_B" in n and not all_zero(t)]
        return bool(b_tensors) and bool(moved), (
            f"checkpoint {after}: {len(moved)} of {len(b_tensors)} lora_B tensors nonzero (init: all zero)"
        )
    prior, why = _tensor_digests(hashes, before, name)
    if prior is None:
        return False, why
    layout = {n: (t.dtype, t.shape) for n, t in table.items()}
    same_layout = layout == {n: (t.dtype, t.shape) for n, t in prior.items()}
    changed = [n for n, t in table.items() if n in prior and prior[n].sha256 != t.sha256]
    return same_layout and bool(changed), (
        f"checkpoint {before} -> {after}: {len(changed)} of {len(table)} adapter tensors changed"
        + ("" if same_layout else "; the tensor layout differs")
    )


def optimizer_step_count(hashes: StateHashes | None, label: str, name: str) -> tuple[float | None, str]:
    """The one AdamW step count every parameter slot of optimizer file ``name`` of checkpoint ``label`` holds, as
    the harness read it from the bytes whose sha256 it recorded for that file; None and why when it read none,
    the counters are of other bytes than the file hashed, or the slots disagree."""
    found, why = checkpoint(hashes, label)
    if found is None:
        return None, why
    counters, hashed = found.optimizer_steps.get(name), found.files.get(name)
    if counters is None or hashed is None:
        return None, f"checkpoint {label}: the harness read no {name}" + ("" if hashed is None else " step counters")
    if counters.sha256 != hashed.sha256:
        return None, f"checkpoint {label}: {name} step counters read from other bytes than the file hashed"
    tally = [(t.value, t.slots) for t in counters.steps]
    if not tally or tally != [(tally[0][0], counters.slots)]:
        return None, f"checkpoint {label}: {name} step counters (value, slots) {tally[:4]} of {counters.slots} slots"
    return tally[0][0], f"{name} {counters.slots} slots at step {tally[0][0]:g}"
