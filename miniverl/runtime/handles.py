"""The role handle both runtimes hand out, and the student-adapter export they share."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from miniverl.canonical import fsync_tree, temp_dir_beside
from miniverl.runtime.base import BatchSize, RoleName, SequenceRows
from miniverl.runtime.batching import AutoPolicy, PhysicalBatch, plan_physical_batches, run_physical_batch
from miniverl.runtime.fused import FusedKernels
from miniverl.runtime.host_memory import trim_host_allocator
from miniverl.runtime.loading import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    decoder_of,
    enable_activation_checkpointing,
    head_weight_of,
)


class ModelRoleHandle:
    """A role bound to one model object. Student: gradients flow; frozen roles run under ``no_grad``."""

    def __init__(self, name: RoleName, model: Any, *, device: torch.device, trainable: bool, auto: AutoPolicy) -> None:
        self.name: RoleName = name
        self.model = model
        self.device = device
        self.trainable = trainable
        self.auto = auto
        self._decoder = decoder_of(model)

    @property
    def head_weight(self) -> torch.Tensor:
        return head_weight_of(self.model)

    def plan(self, rows: SequenceRows, trajectory_batch_size: BatchSize) -> list[list[int]]:
        return plan_physical_batches([len(x) for x in rows.input_ids], trajectory_batch_size, auto=self.auto)

    def iter_selected_hidden(self, rows: SequenceRows, *, trajectory_batch_size: BatchSize) -> Iterator[PhysicalBatch]:
        """One padded forward per step, lazily: a caller may backward each batch before the next."""
        for batch in self.plan(rows, trajectory_batch_size):
            with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
                result = run_physical_batch(self._decoder, rows, batch, device=self.device)
            yield result

    def selected_hidden(self, rows: SequenceRows, *, trajectory_batch_size: BatchSize) -> torch.Tensor:
        pieces: dict[int, torch.Tensor] = {}
        for pb in self.iter_selected_hidden(rows, trajectory_batch_size=trajectory_batch_size):
            for row, part in zip(pb.rows, pb.hidden.split(list(pb.counts)), strict=True):
                pieces[row] = part
        if not pieces:
            raise ValueError("selected_hidden needs at least one row")
        return torch.cat([pieces[i] for i in range(len(rows.input_ids))])


def save_peft_adapter(peft_model: Any, adapter_name: str, directory: str | os.PathLike[str]) -> None:
    """Write ``adapter_name`` as a standard PEFT adapter directory, atomically.

    ``adapter_config.json`` + ``adapter_model.safetensors`` at the top level (the keys carry no
    adapter name), loadable by ``PeftModel.from_pretrained``. ``base_model_name_or_path`` is cleared:
    it may be a local path, and manifests identify the base by content digests instead.
    """
    from peft import get_peft_model_state_dict

    from miniverl.canonical import atomic_write_text
    from miniverl.outputs import check_dir_target, publish_dir, write_safetensors

    target = Path(directory)
    check_dir_target(target, what="adapter")
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"adapter export directory {target} exists and is not empty")
    target.parent.mkdir(parents=True, exist_ok=True)
    state = get_peft_model_state_dict(peft_model, adapter_name=adapter_name)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in sorted(state.items())}
    config = peft_model.peft_config[adapter_name].to_dict()
    config["base_model_name_or_path"] = None
    config["inference_mode"] = True
    tmp = temp_dir_beside(target, f".{target.name}.")
    try:
        write_safetensors(tmp / ADAPTER_WEIGHTS, tensors, metadata={"format": "pt"})
        atomic_write_text(tmp / ADAPTER_CONFIG, json.dumps(_jsonable(config), sort_keys=True, indent=2) + "\n")
        fsync_tree(tmp)
        if target.exists():
            target.rmdir()
        publish_dir(tmp, target, what="adapter")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_jsonable(v) for v in value)
    if hasattr(value, "value") and type(value).__module__.startswith("peft"):
        return value.value  # peft enums (TaskType, PeftType)
    return value


class StudentMemoryPlan:
    """``apply_memory_plan`` of a role runtime over its student model (``_student_model``)."""

    auto: AutoPolicy
    _handles: dict[RoleName, ModelRoleHandle]
    #: the memory plan's ``release_rollout``: leaving ``generation_model`` drops the fast engine's copy
    release_rollout_engine: bool = False

    def _student_model(self) -> Any:
        raise NotImplementedError

    def fuse_training_kernels(self, kind: FusedKernels) -> dict[str, int]:
        """The student's RMSNorm and SwiGLU MLP forwards through ``kind``'s fused kernels
        (:func:`miniverl.runtime.fused.fuse_training_kernels`); how many of each. Refused in one line
        (:class:`DependencyError`) where ``kind``'s kernels cannot run on this device."""
        from miniverl.runtime.fused import check_fused_kernels, fuse_training_kernels

        model = self._student_model()
        check_fused_kernels(kind, next(model.parameters()).device)
        return fuse_training_kernels(model, kind)

    def apply_memory_plan(
        self, *, activation_checkpointing: int, max_tokens: int | None, release_rollout_engine: bool = False
    ) -> None:
        """What a memory plan chose: checkpoint every n-th student layer (0: leave as built); the
        ``trajectory_batch_size: auto`` per-forward token budget (``None``: leave it); whether every
        rollout gives the fast engine's memory back when it ends."""
        self.release_rollout_engine = release_rollout_engine
        if activation_checkpointing:
            enable_activation_checkpointing(self._student_model(), activation_checkpointing)
        if max_tokens is not None:
            self.auto = dataclasses.replace(self.auto, max_tokens=max_tokens)
            for handle in self._handles.values():
                handle.auto = self.auto


@contextmanager
def rollout_memory_scope(model: Any, device: torch.device, *, release: bool) -> Iterator[None]:
    """Where a rollout runs. With ``release`` (the memory plan's ``release_rollout``) the allocator's cached
    blocks go back to the driver first (on CPU, the heap's free pages to the OS), so that the fast engine's copy,
    cache and graphs are allocated beside what is in use rather than on top of the update's cached activations,
    and when the block ends the engine
    cached for ``model`` is dropped (:func:`miniverl.rollout.engine.release_engine`); on CPU the heap's freed
    pages then go back to the OS, so the update starts from the weights alone. Without it, nothing."""
    if not release:
        yield
        return
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "cpu":
        trim_host_allocator()  # the update's freed activations: back to the OS before the copy is folded
    try:
        yield
    finally:
        from miniverl.rollout.engine import release_engine

        if release_engine(model) and device.type == "cpu":
            trim_host_allocator()


def release_device_memory(device: torch.device) -> None:
    """On CUDA: collect reference cycles and return cached blocks (teardown back to baseline).

    On CPU the dropped references are enough; a full ``gc.collect`` costs ~0.5 s with transformers
    loaded and frees nothing the allocator would not reuse.
    """
    if device.type == "cuda" and torch.cuda.is_available():
        import gc

        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
