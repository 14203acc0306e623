"""``miniverl handoff RUN_OR_PLAN --out BUNDLE``: a self-contained verl 0.9 launch directory.

Layout (every path relative to the bundle; no absolute path is written anywhere)::

    config/miniverl_grpo.yaml   the verl Hydra overlay (defaults: ppo_trainer); miniverl_ppo.yaml for PPO
    data/train.parquet          prompts in verl's columns
    reward_fn.py                verl custom_reward_function calling miniverl's reward code
    adapter/                    the LoRA adapter to start from (from a run only)
    critic_adapter/             PPO: the critic's TOKEN_CLS adapter with the value head (score)
    model/                      the base model directory (local models only)
    ir.json  rules.json         the compiled IR and the rules table (canonical JSON)
    launch.sh                   python -m verl.trainer.main_ppo with this config
    manifest.json               every file's sha256, the IR and rules digests, the quantization
                                carried over or not (written last)

The bundle is built in a temporary sibling directory and renamed into place; an existing
``--out`` is refused.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from miniverl import __version__, bounded, progress
from miniverl.canonical import (
    atomic_write_bytes,
    atomic_write_text,
    canonical_bytes,
    fsync_tree,
    sha256_file,
    umask_mode,
)
from miniverl.config.loader import validate_config
from miniverl.config.plan import load_plan
from miniverl.config.schema import MiniverlConfig
from miniverl.data import load_prompts
from miniverl.errors import DataError, UsageError
from miniverl.handoff.compiler import compile_plan_ir
from miniverl.handoff.critic_adapter import critic_model_config
from miniverl.handoff.emit import ADAPTER_DIR, MODEL_DIR, config_name, emit_verl_config, model_path, render_yaml
from miniverl.handoff.ir import ExperimentIR, PpoIR, ir_digest
from miniverl.handoff.launch import launch_script, reward_file
from miniverl.handoff.manifest import (
    MANIFEST_NAME,
    AdapterBinding,
    BundleManifest,
    BundleSource,
    CriticAdapterBinding,
    DirectConfigEvidence,
    ModelBinding,
    file_entries,
)
from miniverl.handoff.rules import load_rules, rules_digest
from miniverl.outputs import copy_file, publish_dir
from miniverl.records import PlanRecord

NATIVE_DIR = "native"
NATIVE_DIFF = "native-diff.json"
VERL_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string(), nullable=False),
        pa.field("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])), nullable=False),
        pa.field("ability", pa.string(), nullable=False),
        pa.field("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())]), nullable=False),
        pa.field(
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("prompt_id", pa.string()),
                    ("prompt", pa.string()),
                    ("context", pa.string()),
                    ("task", pa.string()),
                ]
            ),
            nullable=False,
        ),
    ]
)


def handoff(source: Path, out: Path) -> dict[str, Any]:
    """Compile ``source`` (a plan.json or a run directory) into a bundle at ``out``."""
    if out.exists() or out.is_symlink():
        raise UsageError(f"bundle target {out} already exists; choose another --out (bundles are never overwritten)")
    plan, config, run_dir = _resolve_source(source)
    ir = compile_plan_ir(plan, config, start_adapter=run_dir is not None)
    if ir.model.binding == "bundle":
        _require_model_dir(config)
    tmp = out.parent / f".tmp-handoff-{out.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.mkdir()
    try:
        critic = critic_model_config(ir, config)  # refuses a model whose critic head verl would not train
        written: dict[str, Any] = {}
        adapter = _write_adapter(run_dir, tmp, ir, critic, written) if run_dir is not None else None
        if critic is not None and run_dir is None:
            written = _write_fresh_critic(tmp, ir, critic)
        progress.phase("write", "config, prompts in verl's columns, reward function, launch script, model")
        _write_contents(tmp, ir, plan, config)
        direct = _write_native(tmp, ir, plan) if plan.direct_config is not None else None
        manifest = BundleManifest(
            miniverl_version=__version__,
            compiler=ir.compiler,
            verl_version=ir.verl_version,
            ir_digest=ir_digest(ir),
            rules_digest=rules_digest(ir.compiler),
            source=_source_record(plan, run_dir, adapter),
            model=ModelBinding(
                binding=ir.model.binding,
                model_id=ir.model.model_id,
                revision=ir.model.revision,
                identity_digest=ir.model.identity_digest,
                dtype=ir.model.dtype,
            ),
            quantization=ir.model.quantization,
            adapter=adapter,
            config_name=config_name(ir),
            launch="bash launch.sh",
            deviations=list(ir.deviations),
            files=file_entries(tmp),
            direct_config=direct,
            critic_adapter=_critic_binding(ir, written),
        )
        atomic_write_bytes(
            tmp / MANIFEST_NAME, json.dumps(manifest.model_dump(mode="json"), indent=2, sort_keys=True).encode() + b"\n"
        )
        progress.phase("sync", f"{out}: fsync and rename into place")
        fsync_tree(tmp)
        if out.exists():
            raise UsageError(f"bundle target {out} appeared while writing; nothing was overwritten")
        publish_dir(tmp, out, what="bundle")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {
        "bundle": out.name,
        "out": str(out),
        "compiler": ir.compiler,
        "ir_digest": manifest.ir_digest,
        "rules_digest": manifest.rules_digest,
        "manifest_sha256": sha256_file(out / MANIFEST_NAME),
        "files": sorted(manifest.files),
        "deviations": manifest.deviations,
        "quantization": manifest.quantization.model_dump(mode="json"),
        **({"direct_config": direct.model_dump(mode="json")} if direct is not None else {}),
    }


def _resolve_source(source: Path) -> tuple[PlanRecord, MiniverlConfig, Path | None]:
    if source.is_dir():
        from miniverl.artifacts.rundir import read_plan, require_run_dir

        require_run_dir(source)
        plan = read_plan(source)
        config = validate_config(dict(plan.config), origin=str(source / "plan.json"))
        return plan, config, source
    if not source.is_file():
        raise UsageError(f"{source} is neither a plan.json nor a run directory")
    plan, config = load_plan(source)
    return plan, config, None


def _write_contents(root: Path, ir: ExperimentIR, plan: PlanRecord, config: MiniverlConfig) -> None:
    header = (
        f"verl {ir.verl_version} config written by miniverl {__version__} handoff ({ir.compiler}).\n"
        f"IR sha256 {ir_digest(ir)}; plan sha256 {plan.plan_digest}.\n"
        "Launch with `bash launch.sh`; it passes the bundle's locations on the command line."
    )
    name = config_name(ir)
    atomic_write_text(root / "config" / f"{name}.yaml", render_yaml(emit_verl_config(ir), header=header))
    atomic_write_bytes(
        root / ir.data.train_file, verl_parquet_bytes(Path(plan.data.path), plan.data.sha256, config.data.columns)
    )
    atomic_write_text(root / ir.reward.function_file, reward_file(ir))
    atomic_write_text(root / "launch.sh", launch_script(ir, name))
    os.chmod(root / "launch.sh", umask_mode(directory=True))  # executable, within the user's umask
    atomic_write_bytes(root / "ir.json", canonical_bytes(ir.model_dump(mode="json")) + b"\n")
    atomic_write_bytes(root / "rules.json", canonical_bytes(load_rules(ir.compiler).model_dump(mode="json")) + b"\n")
    if ir.model.binding == "bundle":
        _copy_model(config, root / MODEL_DIR)


def _write_native(root: Path, ir: ExperimentIR, plan: PlanRecord) -> DirectConfigEvidence:
    """Direct-config: the native YAML's exact bytes and the key-by-key diff against the bundle's config."""
    from miniverl.handoff.native import native_diff, verified_native

    direct = plan.direct_config
    assert direct is not None
    raw = verified_native(direct)
    atomic_write_bytes(root / NATIVE_DIR / direct.native.name, raw)
    added = sum(link.added_cycles for link in plan.lineage)  # run --resume --extend N, recorded in the plan
    diff = native_diff(raw, emit_verl_config(ir), added_cycles=added)
    atomic_write_bytes(root / NATIVE_DIFF, json.dumps(diff, indent=2, sort_keys=True).encode() + b"\n")
    return DirectConfigEvidence(
        compiler=direct.compiler,
        native_name=f"{NATIVE_DIR}/{direct.native.name}",
        native_sha256=direct.native.sha256,
        rules_digest=direct.rules_digest,
        import_digest=direct.import_digest,
        runtime_bindings=_portable_bindings(direct.runtime_bindings, ir),
        diff_file=NATIVE_DIFF,
        semantically_equal=bool(diff["semantically_equal"]),
    )


def _portable_bindings(bindings: dict[str, Any], ir: ExperimentIR) -> dict[str, Any]:
    """The bindings without a local path: a local model is the bundle's model/ (identity in manifest.model)."""
    if ir.model.binding == "bundle":
        return {**bindings, "model": f"{MODEL_DIR}/ (a local directory, copied into the bundle)"}
    return dict(bindings)


def verl_parquet_bytes(path: Path, sha256: str, columns: Mapping[Any, str] | None = None) -> bytes:
    """The plan's prompts (any accepted format, ``data.columns`` applied) in verl's RLHFDataset columns
    (deterministic Parquet bytes)."""
    if not path.is_file():
        raise DataError(f"data file not found: {path} (bound by the plan; run handoff where the plan was made)")
    if sha256_file(path) != sha256:
        raise DataError(f"data file {path} changed since `miniverl plan` (sha256 mismatch); re-run plan")
    rows = load_prompts(path, columns)
    table = pa.table(
        {
            "data_source": [f"miniverl/{r.task}" for r in rows],
            "prompt": [[{"role": "user", "content": r.prompt}] for r in rows],
            "ability": [r.task for r in rows],
            "reward_model": [{"style": "rule", "ground_truth": r.answer} for r in rows],
            "extra_info": [
                {"index": i, "prompt_id": r.prompt_id, "prompt": r.prompt, "context": r.context, "task": r.task}
                for i, r in enumerate(rows)
            ],
        },
        schema=VERL_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        compression_level=3,
        use_dictionary=False,
        write_statistics=False,
        row_group_size=max(1, table.num_rows),
    )
    return sink.getvalue()


def _require_model_dir(config: MiniverlConfig) -> None:
    student = config.models.student
    assert student.path is not None
    src = Path(student.path)
    if not (src / "config.json").is_file():
        raise UsageError(f"models.student.path {student.path} is not a Hugging Face model directory (no config.json)")
    if not any(src.glob("*.safetensors")):
        raise UsageError(
            f"models.student.path {student.path} has no *.safetensors weights: verl's LoRA rollout loads vLLM's base "
            "model from them (rollout.load_format: safetensors); save it with save_pretrained(..., "
            "safe_serialization=True)"
        )


def _copy_model(config: MiniverlConfig, target: Path) -> None:
    """The local base into the bundle (``handoff`` checked it with :func:`_require_model_dir` before writing)."""
    source = config.models.student.path
    assert source is not None
    shutil.copytree(
        Path(source),
        target,
        symlinks=False,
        ignore=shutil.ignore_patterns(".*"),
        copy_function=lambda source, dest: copy_file(Path(source), dest, what="model copy"),
    )


def _critic_binding(ir: ExperimentIR, written: dict[str, Any]) -> CriticAdapterBinding | None:
    if not isinstance(ir.algorithm, PpoIR):
        return None
    return CriticAdapterBinding(
        start=ir.algorithm.critic.start, hidden_size=written["hidden_size"], lora_tensors=written["lora_tensors"]
    )


def _write_fresh_critic(root: Path, ir: ExperimentIR, model_config: dict[str, Any]) -> dict[str, Any]:
    """A plan's critic: miniverl's seeded value head, no LoRA tensors (peft's fresh init in verl)."""
    from miniverl.handoff.critic_adapter import require_trained_head, seeded_value_head, write_critic_adapter

    assert isinstance(ir.algorithm, PpoIR)
    hidden = require_trained_head(ir, model_config)
    head = seeded_value_head(hidden, ir.algorithm.critic.head_seed)
    return write_critic_adapter(root, ir, model_path(ir), head, None)


def _write_adapter(
    run_dir: Path, root: Path, ir: ExperimentIR, critic: dict[str, Any] | None, written: dict[str, Any]
) -> AdapterBinding:
    """Export the run's last checkpoint (verified PEFT reload), keep the PEFT files, strip local paths.

    PPO: the exported critic (LoRA + value head, reload-verified) becomes ``critic_adapter/``.
    """
    from miniverl.artifacts.export import export_run

    base_name = model_path(ir)
    staging = root.parent / f"{root.name}-export"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        result = export_run(run_dir, staging)
        target = root / ADAPTER_DIR
        target.mkdir()
        for name in ("adapter_model.safetensors", "adapter_config.json"):
            copy_file(staging / name, target / name, what="adapter copy")
        if critic is not None:
            from miniverl.handoff.critic_adapter import run_critic_tensors, write_critic_adapter

            lora, head = run_critic_tensors(staging / "critic")
            written.update(write_critic_adapter(root, ir, base_name, head, lora))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    config_path = target / "adapter_config.json"
    adapter_config = bounded.read_json(config_path, limit=bounded.MODEL_CONFIG_MAX_BYTES, what="an adapter config")
    adapter_config["base_model_name_or_path"] = base_name
    atomic_write_text(config_path, json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    reload = result["reload"]
    return AdapterBinding(
        checkpoint_step=int(result["step"]),
        reload_max_abs_logit_diff=float(reload["max_abs_logit_diff"]),
        reload_tolerance=float(reload["tolerance"]),
    )


def _source_record(plan: PlanRecord, run_dir: Path | None, adapter: AdapterBinding | None) -> BundleSource:
    if run_dir is None:
        return BundleSource(kind="plan", plan_digest=plan.plan_digest)
    from miniverl.artifacts.rundir import read_manifest

    return BundleSource(
        kind="run",
        plan_digest=plan.plan_digest,
        run_id=read_manifest(run_dir).run_id,
        checkpoint_step=adapter.checkpoint_step if adapter else None,
    )
