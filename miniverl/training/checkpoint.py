"""Transactional checkpoints: temp dir, fsync, rename; ``checkpoint.json`` (written last) binds each file.

No pickle: tensors go to safetensors, everything else to canonical JSON.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from miniverl.canonical import atomic_write_json, fsync_tree, sha256_file
from miniverl.errors import CheckpointError
from miniverl.outputs import check_dir_target, publish_dir, write_safetensors
from miniverl.records import CheckpointFile, CheckpointRecord
from miniverl.training.checkpoint_files import (
    ADAPTER_DIR,
    OPTIMIZER,
    RECORD,
    RNG,
    STATE,
    STATE_MAX_BYTES,
    STUDENT_PARAMS,
    as_os_error,
    list_checkpoints,
    read_checkpoint_json,
    step_dir_name,
)


def _write(path: Path, write: Any) -> None:
    """``write()`` (a safetensors or PEFT save into ``path``), its I/O errors raised as OSError."""
    try:
        write()
    except Exception as exc:
        error = as_os_error(exc, path)
        if error is None:
            raise
        raise error from None


@dataclass
class TrainingState:
    step: int
    cycle: int
    policy_version: int
    data_cursor: int
    plan_digest: str
    config_digest: str
    extra: dict[str, Any]
    #: the run directory's outputs this checkpoint commits: metrics.jsonl's line count, trajectories' sha256
    metrics_lines: int = 0
    trajectories: dict[str, str] = field(default_factory=dict)


def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{index}"] = state
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    py_version, py_state, py_gauss = random.getstate()
    json_part = {
        "python": {"version": py_version, "state": list(py_state), "gauss": py_gauss},
        "numpy": {
            "name": np_name,
            "keys": [int(k) for k in np_keys],
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
    }
    return tensors, json_part


def restore_rng(tensors: dict[str, torch.Tensor], json_part: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda_states = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda_states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
    py = json_part["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    npart = json_part["numpy"]
    keys = np.asarray(npart["keys"], dtype=np.uint32)
    np.random.set_state((npart["name"], keys, npart["pos"], npart["has_gauss"], npart["gauss"]))


#: the AdamW param-group flags that pick an implementation (same math, float tolerance apart)
IMPLEMENTATION_FLAGS = ("fused", "foreach")


def optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for index, slot in state["state"].items():
        for key, value in slot.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"state.{index}.{key}"] = tensor.detach().cpu().contiguous()
    return tensors, {"param_groups": state["param_groups"]}


def optimizer_from_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        _, index, key = name.split(".", 2)
        slots.setdefault(int(index), {})[key] = tensor
    # the implementation (fused, foreach) is this process's choice for its device, not the checkpoint's: a run
    # saved by the other implementation resumes on this one; torch places the step tensors by these flags
    groups = [
        {**saved, **{k: live[k] for k in IMPLEMENTATION_FLAGS if k in live}}
        for saved, live in zip(meta["param_groups"], optimizer.param_groups, strict=True)
    ]
    optimizer.load_state_dict({"state": slots, "param_groups": groups})


def write_checkpoint(
    checkpoints_root: Path,
    state: TrainingState,
    student_params: Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    save_adapter: Any,
    *,
    extra_tensors: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    extra_dirs: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``checkpoints_root/step-N`` atomically; ``save_adapter(dir)`` writes the PEFT adapter.

    ``extra_tensors`` (file name -> tensors) and ``extra_dirs`` (directory name -> writer) carry an
    algorithm's own state, e.g. PPO's critic parameters, its optimizer and its exported adapter.
    """
    list_checkpoints(checkpoints_root)  # refuses a symlinked root or step directory: writes stay in the run
    final = checkpoints_root / step_dir_name(state.step)
    if final.exists():
        raise CheckpointError(f"checkpoint {final.name} already exists")
    tmp = checkpoints_root / f".tmp-{final.name}"
    check_dir_target(tmp, what="checkpoint temp")  # a leftover of a killed write is a real directory, never a link
    check_dir_target(final, what="checkpoint")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        params = {k: v.detach().cpu().contiguous() for k, v in student_params.items()}
        _write(tmp / STUDENT_PARAMS, lambda: write_safetensors(tmp / STUDENT_PARAMS, params))
        opt_tensors, opt_meta = optimizer_to_tensors(optimizer)
        _write(tmp / OPTIMIZER, lambda: write_safetensors(tmp / OPTIMIZER, opt_tensors))
        rng_tensors, rng_json = capture_rng()
        _write(tmp / RNG, lambda: write_safetensors(tmp / RNG, rng_tensors))
        atomic_write_json(
            tmp / STATE,
            {
                "optimizer": opt_meta,
                "rng": rng_json,
                "extra": state.extra,
            },
        )
        _write(tmp / ADAPTER_DIR, lambda: save_adapter(str(tmp / ADAPTER_DIR)))
        for file_name, tensors in (extra_tensors or {}).items():
            extra = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
            _write(tmp / file_name, lambda: write_safetensors(tmp / file_name, extra))  # noqa: B023 (called at once)
        for dir_name, writer in (extra_dirs or {}).items():
            _write(tmp / dir_name, lambda: writer(str(tmp / dir_name)))  # noqa: B023 (called at once)
        files = {
            p.relative_to(tmp).as_posix(): CheckpointFile(sha256=sha256_file(p), bytes=p.stat().st_size)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        record = CheckpointRecord(
            step=state.step,
            cycle=state.cycle,
            policy_version=state.policy_version,
            data_cursor=state.data_cursor,
            plan_digest=state.plan_digest,
            config_digest=state.config_digest,
            files=files,
            metrics_lines=state.metrics_lines,
            trajectories=state.trajectories,
        )
        fsync_tree(tmp)
        atomic_write_json(tmp / RECORD, record.model_dump(mode="json"), pretty=True)
        publish_dir(tmp, final, what="checkpoint")
        fsync_tree(checkpoints_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def read_checkpoint(directory: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """Student params, optimizer tensors and state.json of a verified checkpoint (RNG restored separately)."""
    # verified by its sha256 first; read bounded all the same (a verified file is still size-capped)
    state: Any = read_checkpoint_json(directory / STATE, limit=STATE_MAX_BYTES, what="a checkpoint state")
    return load_file(directory / STUDENT_PARAMS), load_file(directory / OPTIMIZER), state


def read_extra_tensors(directory: Path, names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    """The algorithm's own tensor files of a verified checkpoint."""
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise CheckpointError(
            f"checkpoint {directory.name} lacks {', '.join(missing)}; it belongs to another algorithm"
        )
    return {n: load_file(directory / n) for n in names}


def restore_rng_from(directory: Path, state: dict[str, Any]) -> None:
    restore_rng(load_file(directory / RNG), state["rng"])
