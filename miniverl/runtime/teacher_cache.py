"""The offline-KD teacher cache: safetensors shards plus a JSON index with checksums. No pickle.

Layout of a cache directory::

    index.json            canonical JSON, written last (see below)
    head.safetensors      exact caches only: the teacher head ``[V, H]``
    shard-00000.safetensors ...  row-aligned targets of consecutive rows

``index.json`` holds the format, the target kind (``hidden``: selected hidden states for exact
objectives; ``topk``: top-k ids and log-probs), the settings the targets depend on (``top_k``,
``temperature`` for top-k), the teacher's identity (content digests), the digest of the rows
(token ids + selected positions), each shard's row range and sha256, and the head's sha256.

Loading refuses a cache that is *stale* (other rows, another teacher identity, other settings, or
another format) and one that is *corrupt* (a checksum or shape mismatch), each with one line that
says how to mend it. Writing goes to a temporary directory that is fsynced and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from miniverl import bounded
from miniverl.canonical import atomic_write_json, fsync_tree, sha256_file, sha256_json, temp_dir_beside
from miniverl.config.strict import loads_json
from miniverl.errors import DataError
from miniverl.runtime.base import BatchSize, RoleName, RoleRuntime, SequenceRows
from miniverl.runtime.objectives import ObjectiveSpec, TeacherTargets, rows_digest, score_teacher

FORMAT = "miniverl-teacher-cache/v1"
INDEX = "index.json"
HEAD = "head.safetensors"


class TeacherCacheError(DataError):
    """A teacher cache is missing, corrupt, or stale for the rows/teacher/settings asked for."""


def _settings(kind: str, objective: ObjectiveSpec) -> dict[str, Any]:
    if kind == "topk":
        return {"top_k": objective.top_k, "temperature": objective.temperature}
    return {}


def write_teacher_cache(
    directory: str | os.PathLike[str],
    rows: SequenceRows,
    targets: TeacherTargets,
    *,
    objective: ObjectiveSpec,
    teacher_identity: Mapping[str, Any],
    rows_per_shard: int = 256,
) -> dict[str, Any]:
    """Write ``targets`` for ``rows``; returns the index. Refuses to overwrite an existing cache."""
    from miniverl.outputs import publish_dir, write_safetensors

    if targets.counts != rows.selected_counts:
        raise ValueError("teacher targets do not match the rows' selected positions")
    if rows_per_shard < 1:
        raise ValueError("rows_per_shard must be >= 1")
    target = Path(directory)
    if target.exists():
        raise TeacherCacheError(f"teacher cache {target} already exists; remove it or write to a new directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(target, f".{target.name}.")
    try:
        offsets = [0]
        for c in targets.counts:
            offsets.append(offsets[-1] + c)
        shards = []
        names = ("hidden",) if targets.kind == "hidden" else ("topk_ids", "topk_logprobs")
        for number, start in enumerate(range(0, len(targets.counts), rows_per_shard)):
            end = min(start + rows_per_shard, len(targets.counts))
            lo, hi = offsets[start], offsets[end]
            tensors = {n: getattr(targets, n)[lo:hi].detach().to("cpu").contiguous() for n in names}
            name = f"shard-{number:05d}.safetensors"
            write_safetensors(tmp / name, tensors, metadata={"format": "pt"})
            shards.append({"file": name, "rows": [start, end], "positions": hi - lo, "sha256": sha256_file(tmp / name)})
        index: dict[str, Any] = {
            "format": FORMAT,
            "kind": targets.kind,
            "settings": _settings(targets.kind, objective),
            "teacher": dict(teacher_identity),
            "rows_sha256": rows_digest(rows),
            "rows": len(rows.input_ids),
            "counts": list(targets.counts),
            "shards": shards,
            "head": None,
        }
        if targets.kind == "hidden":
            assert targets.head is not None
            head = {"head": targets.head.detach().to("cpu").contiguous()}
            write_safetensors(tmp / HEAD, head, metadata={"format": "pt"})
            index["head"] = {"file": HEAD, "sha256": sha256_file(tmp / HEAD)}
        index["index_sha256"] = sha256_json(index)
        atomic_write_json(tmp / INDEX, index)
        fsync_tree(tmp)
        publish_dir(tmp, target, what="teacher cache")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return index


def read_index(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(directory) / INDEX
    if not path.is_file():
        raise TeacherCacheError(f"no teacher cache at {directory} ({INDEX} missing); build it first")
    try:
        index: dict[str, Any] = loads_json(
            bounded.read_text(path, limit=bounded.PLAN_MAX_BYTES, what="a teacher cache index")
        )
    except ValueError as exc:  # malformed, duplicate keys, non-finite, not UTF-8
        raise TeacherCacheError(f"teacher cache index {path} is not valid JSON ({exc}); rebuild the cache") from None
    claimed = index.pop("index_sha256", None)
    if claimed != sha256_json(index):
        raise TeacherCacheError(f"teacher cache index {path} fails its checksum; rebuild the cache")
    index["index_sha256"] = claimed
    return index


def load_teacher_cache(
    directory: str | os.PathLike[str],
    rows: SequenceRows,
    *,
    objective: ObjectiveSpec,
    teacher_identity: Mapping[str, Any],
    device: torch.device | str = "cpu",
) -> TeacherTargets:
    """Targets for ``rows`` from the cache; refused when stale or corrupt (:class:`TeacherCacheError`)."""
    from safetensors.torch import load_file

    root = Path(directory)
    index = read_index(root)
    want_kind = objective.target_kind
    stale = []
    if index.get("format") != FORMAT:
        stale.append(f"format {index.get('format')!r} is not {FORMAT!r}")
    if index.get("kind") != want_kind:
        stale.append(f"it holds {index.get('kind')!r} targets but the objective needs {want_kind!r}")
    elif index.get("settings") != _settings(want_kind, objective):
        stale.append(f"settings {index.get('settings')} differ from {_settings(want_kind, objective)}")
    if index.get("teacher") != json.loads(json.dumps(dict(teacher_identity))):
        stale.append("it was written by another teacher")
    if index.get("rows_sha256") != rows_digest(rows):
        stale.append("it was written for other rows (token ids or selected positions changed)")
    if stale:
        raise TeacherCacheError(f"teacher cache {root} is stale: {'; '.join(stale)}; rebuild it")
    parts: dict[str, list[torch.Tensor]] = {}
    for shard in index["shards"]:
        path = root / shard["file"]
        if not path.is_file() or sha256_file(path) != shard["sha256"]:
            raise TeacherCacheError(f"teacher cache shard {shard['file']} is missing or corrupt; rebuild the cache")
        for name, tensor in load_file(str(path)).items():
            if tensor.shape[0] != shard["positions"]:
                raise TeacherCacheError(f"teacher cache shard {shard['file']} has the wrong number of positions")
            parts.setdefault(name, []).append(tensor)
    cat = {name: torch.cat(tensors).to(device) for name, tensors in parts.items()}
    counts = tuple(rows.selected_counts)
    if any(t.shape[0] != sum(counts) for t in cat.values()):
        raise TeacherCacheError(f"teacher cache {root} does not cover every selected position; rebuild it")
    if want_kind == "hidden":
        head_entry = index.get("head") or {}
        head_path = root / str(head_entry.get("file", HEAD))
        if not head_path.is_file() or sha256_file(head_path) != head_entry.get("sha256"):
            raise TeacherCacheError(f"teacher cache head {head_path.name} is missing or corrupt; rebuild the cache")
        head = load_file(str(head_path))["head"].to(device)
        return TeacherTargets(counts=counts, hidden=cat.get("hidden"), head=head)
    return TeacherTargets(counts=counts, topk_ids=cat.get("topk_ids"), topk_logprobs=cat.get("topk_logprobs"))


def teacher_identity(runtime: RoleRuntime, role: RoleName = "teacher") -> dict[str, Any]:
    """What a cache is keyed on: the role's content identity (base + adapter digests), no paths.

    Independent of the runtime kind: a cache written under ``dual_model`` stays valid under
    ``shared_backbone`` for the same base and adapter.
    """
    manifest = runtime.role_manifest()
    entry = dict(manifest["roles"][role])
    base = entry.get("base", manifest.get("backbone", {}).get("base"))
    quantization = entry.get("quantization", manifest.get("backbone", {}).get("quantization"))
    return {
        "role": role,
        "base": base,
        "quantization": quantization,
        "adapter": entry.get("adapter"),
        "privileged_context": bool(entry.get("privileged_context", False)),
    }


def build_teacher_cache(
    runtime: RoleRuntime,
    rows: SequenceRows,
    directory: str | os.PathLike[str],
    *,
    objective: ObjectiveSpec,
    trajectory_batch_size: BatchSize = 1,
    rows_per_shard: int = 256,
) -> dict[str, Any]:
    """Score ``rows`` with the runtime's teacher and write the cache (offline KD); returns the index."""
    targets = score_teacher(runtime, rows, objective, trajectory_batch_size=trajectory_batch_size)
    return write_teacher_cache(
        directory,
        rows,
        targets,
        objective=objective,
        teacher_identity=teacher_identity(runtime),
        rows_per_shard=rows_per_shard,
    )
