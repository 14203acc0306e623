"""The bundle manifest (``manifest.json``): every file's sha256 plus the IR and rules digests.

``quantization`` (the IR's ``model.quantization``) says whether the base weights' quantization was
carried over to verl: an NF4 run is handed off on the same base in full precision (``model.dtype``).

Its JSON Schema is ``manifests/handoff/bundle-manifest.schema.json`` (a test fails on drift).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from miniverl import bounded
from miniverl.canonical import sha256_file
from miniverl.config.strict import loads_json
from miniverl.errors import UsageError
from miniverl.handoff.ir import QuantizationIR

SHA256 = Field(pattern=r"^[0-9a-f]{64}$")
MANIFEST_NAME = "manifest.json"
SCHEMA_PATH = "manifests/handoff/bundle-manifest.schema.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BundleFile(_Strict):
    sha256: str = SHA256
    bytes: int = Field(ge=0)


class BundleSource(_Strict):
    kind: Literal["plan", "run"]
    plan_digest: str = SHA256
    run_id: str | None = None
    checkpoint_step: int | None = None


class AdapterBinding(_Strict):
    """The LoRA adapter the verl actor starts from (a run's last checkpoint, exported and reload-verified)."""

    checkpoint_step: int
    reload_max_abs_logit_diff: float
    reload_tolerance: float


class CriticAdapterBinding(_Strict):
    """PPO: the critic verl starts from (``critic.model.lora_adapter_path``), value head included."""

    directory: Literal["critic_adapter"] = "critic_adapter"
    task_type: Literal["TOKEN_CLS"] = "TOKEN_CLS"
    value_head: Literal["score"] = "score"
    start: Literal["seeded_head", "run_checkpoint"]
    hidden_size: int = Field(ge=1)
    lora_tensors: int = Field(ge=0)


class ModelBinding(_Strict):
    """The base model verl loads: always unquantized, at ``dtype`` (``BundleManifest.quantization``)."""

    binding: Literal["hub", "builtin", "bundle"]
    model_id: str | None
    revision: str | None
    identity_digest: str = SHA256
    dtype: Literal["float32", "bfloat16", "float16"]


class DirectConfigEvidence(_Strict):
    """A bundle of a direct-config plan (compiler v4): the native file's identity and the diff's verdict."""

    compiler: Literal["verl-rl-v0.9-single-gpu-v4"]
    native_name: str
    native_sha256: str = SHA256
    rules_digest: str = SHA256
    import_digest: str = SHA256
    runtime_bindings: dict[str, Any]
    diff_file: str
    semantically_equal: bool


class BundleManifest(_Strict):
    kind: Literal["miniverl.handoff-bundle"] = "miniverl.handoff-bundle"
    schema_version: Literal[1] = 1
    miniverl_version: str
    compiler: str
    verl_version: str
    ir_digest: str = SHA256
    rules_digest: str = SHA256
    source: BundleSource
    model: ModelBinding
    quantization: QuantizationIR
    adapter: AdapterBinding | None
    config_name: str
    launch: str
    deviations: list[str]
    files: dict[str, BundleFile]
    direct_config: DirectConfigEvidence | None = None
    critic_adapter: CriticAdapterBinding | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_direct_config(self, handler: SerializerFunctionWrapHandler) -> Any:
        out = handler(self)
        for key in ("direct_config", "critic_adapter"):
            if isinstance(out, dict) and out.get(key, 0) is None:
                out.pop(key)
        return out


def quantization_note(quantization: QuantizationIR, dtype: str) -> str | None:
    """The human line for a quantization that was not carried over (None when it was)."""
    if quantization.carried_over:
        return None
    return (
        f"note: trained on {quantization.trained.upper()} base weights; verl loads the {dtype} base "
        "(quantization not carried over)"
    )


def file_entries(root: Path) -> dict[str, BundleFile]:
    """sha256 and size of every regular file under ``root`` except the manifest itself."""
    out: dict[str, BundleFile] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and rel != MANIFEST_NAME:
            out[rel] = BundleFile(sha256=sha256_file(path), bytes=path.stat().st_size)
    return out


def read_manifest(bundle: Path) -> BundleManifest:
    path = bundle / MANIFEST_NAME
    if not bundle.is_dir():
        raise UsageError(f"bundle not found: {bundle} (create one with `miniverl handoff RUN_OR_PLAN --out DIR`)")
    try:
        raw: Any = loads_json(bounded.read_text(path, limit=bounded.PLAN_MAX_BYTES, what="a bundle manifest"))
    except FileNotFoundError:
        raise UsageError(f"{bundle} is not a handoff bundle (no {MANIFEST_NAME})") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; a bundle manifest must be a JSON file") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}") from None
    except ValueError:  # malformed, duplicate keys, non-finite, not UTF-8
        raise UsageError(f"{path} is not valid JSON") from None
    try:
        return BundleManifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UsageError(f"{path} does not match the bundle manifest schema ({where}: {first['msg']})") from None


def verify_files(bundle: Path, manifest: BundleManifest) -> list[str]:
    """Problems with the bundle's files against its manifest (empty when every hash matches)."""
    problems = []
    actual = file_entries(bundle)
    for name, entry in manifest.files.items():
        found = actual.get(name)
        if found is None:
            problems.append(f"missing {name}")
        elif found.sha256 != entry.sha256:
            problems.append(f"changed {name}")
    problems += [f"unlisted {name}" for name in sorted(set(actual) - set(manifest.files))]
    return problems


def schema_text() -> str:
    schema: dict[str, Any] = BundleManifest.model_json_schema()
    schema["$id"] = "https://miniverl.invalid/schemas/handoff/bundle-manifest.schema.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
