"""Resolve a :class:`ModelSpec` to local files and a content identity, without loading weights.

Sources:

- ``hub``: a ``model_id`` and revision that miniverl pins file by file (:mod:`miniverl.models.pinned`, e.g. the
  seed's Qwen3-0.6B) is fetched into the miniverl cache and every file checked against its recorded sha256;
  any other: ``snapshot_download(model_id, revision=<40-hex>)`` through huggingface_hub. With
  ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) set only the local Hugging Face cache is used.
  A mutable revision (allowed only with ``allow_mutable_revision``) is resolved to its commit sha,
  which is what the identity records.
- ``local``: a directory with ``config.json`` and ``*.safetensors`` weights (pickle weights refused).
- ``gguf``: a ``.gguf`` file (dequantized when loaded).
- ``builtin``: the embedded model's verified cache (see :mod:`miniverl.models.builtin`); with
  ``fetch=False`` its identity and architecture come from the pins alone.
- ``student``: the student's spec (teachers and references that share the student's base).

An identity holds content digests only, never a local path. This module never imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from miniverl import bounded
from miniverl.canonical import sha256_file, sha256_json, tree_digest
from miniverl.config.schema import IMMUTABLE_REVISION, AdapterSpec, ModelSpec
from miniverl.config.strict import loads_json
from miniverl.errors import ModelSourceError

SourceKind = Literal["hub", "local", "gguf", "builtin"]

HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
HUB_ADAPTER_PATTERNS = ["adapter_config.json", "adapter_model.safetensors", "*.json", "*.txt", "*.jinja"]
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model's files are and what it is.

    ``path`` is a model directory (hub snapshot, local directory, builtin cache) or, for ``gguf``,
    the ``.gguf`` file; it is None when resolved with ``fetch=False`` (identity only).
    ``config`` is the parsed ``config.json`` (or, for an unfetched builtin, its pinned
    architecture fields) when known. ``identity`` is :func:`model_identity` of the base model.
    ``label`` is what the user asked for, for messages.
    """

    source: SourceKind
    identity: dict[str, Any]
    label: str
    path: Path | None = None
    config: Mapping[str, Any] | None = None
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def fetched(self) -> bool:
        return self.path is not None


# ---------------------------------------------------------------------------------------------- resolve


def resolve(
    spec: ModelSpec,
    *,
    student: ModelSpec | None = None,
    fetch: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
) -> ResolvedModel:
    """Resolve ``spec``; ``fetch=False`` touches as little as possible (no weights, no conversion).

    ``student`` is needed for ``source: student``. Raises :class:`ModelSourceError` with one clear
    line when the model cannot be found or does not match its pin.
    """
    if spec.source == "student":
        if student is None or student.source == "student":
            raise ModelSourceError("source 'student' needs the student's model spec")
        return resolve(student, fetch=fetch, cache_dir=cache_dir, progress=progress)
    if spec.source == "hub":
        return _resolve_hub(spec, fetch=fetch, cache_dir=cache_dir)
    if spec.source == "local":
        return _resolve_local(spec)
    if spec.source == "gguf":
        return _resolve_gguf(spec)
    if spec.source == "builtin":
        return _resolve_builtin(spec, fetch=fetch, cache_dir=cache_dir, progress=progress)
    raise ModelSourceError(f"unknown model source {spec.source!r}")  # pragma: no cover - schema refuses


def model_identity(spec: ModelSpec, resolved: ResolvedModel) -> dict[str, Any]:
    """The content identity of the model ``spec`` describes: base digests plus any pinned adapter.

    - hub: ``{source, model_id, revision}`` (revision: the resolved 40-hex commit), plus ``files_sha256`` (sha256 of
      the pinned ``{file: sha256}`` map) for a model miniverl pins file by file
    - local: ``{source, tree_sha256, files}``, ``files`` = ``{relative name: sha256}`` and
      ``tree_sha256`` = sha256 of its canonical JSON
    - gguf: ``{source, sha256}``
    - builtin: ``{source, name, wheel_sha256, gguf_sha256}``

    A frozen adapter adds ``adapter`` (hub: ``{source, repo_id, revision}``; local:
    ``{source, sha256}`` of ``adapter_model.safetensors``). Never holds a local path.
    """
    identity = dict(resolved.identity)
    if spec.adapter is not None:
        identity["adapter"] = adapter_identity(spec.adapter)
    return identity


def plan_identity(spec: ModelSpec, *, student: ModelSpec | None = None) -> dict[str, Any]:
    """:func:`model_identity` at plan time: resolves with ``fetch=False``."""
    return model_identity(spec, resolve(spec, student=student, fetch=False))


def plan_architecture(spec: ModelSpec, *, student: ModelSpec | None = None) -> dict[str, Any] | None:
    """:func:`describe_architecture` at plan time, or None when it cannot be known without fetching."""
    resolved = resolve(spec, student=student, fetch=False)
    if resolved.config is None and not (resolved.source == "gguf" and resolved.path is not None):
        return None
    return describe_architecture(resolved)


# ------------------------------------------------------------------------------------------------- hub


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) is set, read at call time."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> str | None:
    """The Hugging Face hub cache from the environment at call time (None: the library default)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def hub_snapshot(repo_id: str, revision: str, *, allow_patterns: list[str], what: str) -> Path:
    """``snapshot_download`` honouring offline mode; errors become one-line ModelSourceErrors."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = hub_offline()
    label = f"{what} {repo_id}@{revision}"
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=hub_cache_dir(),
            local_files_only=offline,
            allow_patterns=allow_patterns,
        )
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        if offline:
            raise ModelSourceError(
                f"{label} not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                "download it on a connected machine or unset HF_HUB_OFFLINE"
            ) from None
        raise ModelSourceError(f"{label} could not be downloaded: {_first_line(exc)}") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelSourceError(f"{label}: repository not found or not accessible on the hub") from None
    except RevisionNotFoundError:
        raise ModelSourceError(f"{label}: revision not found in the repository") from None
    except (HfHubHTTPError, HFValidationError, OSError, ValueError) as exc:
        raise ModelSourceError(f"{label} could not be resolved: {_first_line(exc)}") from None
    path = Path(str(folder))
    if not IMMUTABLE_REVISION.match(path.name):
        raise ModelSourceError(f"{label}: the hub cache returned {path.name!r}, not a commit snapshot")
    return path


def _resolve_hub(spec: ModelSpec, *, fetch: bool, cache_dir: str | os.PathLike[str] | None = None) -> ResolvedModel:
    assert spec.model_id is not None and spec.revision is not None  # the schema guarantees both
    from miniverl.models.pinned import fetch_pinned, pin_for, pin_identity

    pin = pin_for(spec.model_id, spec.revision)
    if pin is not None:
        # Pinned file by file: fetched (or re-verified) even for a plan, which must not name what it cannot verify.
        directory = fetch_pinned(pin, cache_dir)
        config = _read_config(directory / "config.json", label=f"model {pin.label}")
        files = {name: pinned.sha256 for name, pinned in pin.files.items()}
        return ResolvedModel("hub", pin_identity(pin), pin.label, directory if fetch else None, config, files)
    patterns = HUB_ALLOW_PATTERNS if fetch else ["config.json"]
    snapshot = hub_snapshot(spec.model_id, spec.revision, allow_patterns=patterns, what="model")
    commit = snapshot.name
    label = f"{spec.model_id}@{spec.revision}"
    config = _read_config(snapshot / "config.json", label=f"model {label}")
    if fetch:
        _require_safetensors(snapshot, label=f"model {label}")
    identity = {"source": "hub", "model_id": spec.model_id, "revision": commit}
    return ResolvedModel("hub", identity, label, snapshot if fetch else None, config)


# ----------------------------------------------------------------------------------------------- local


def _resolve_local(spec: ModelSpec) -> ResolvedModel:
    assert spec.path is not None
    directory = Path(spec.path).expanduser()
    if not directory.is_dir():
        raise ModelSourceError(f"model directory not found: {spec.path}")
    config = _read_config(directory / "config.json", label=f"model directory {spec.path}")
    _require_safetensors(directory, label=f"model directory {spec.path}")
    files = local_tree_files(directory)
    identity = {"source": "local", "tree_sha256": sha256_json(files), "files": files}
    return ResolvedModel("local", identity, spec.path, directory, config, files)


def local_tree_files(directory: Path) -> dict[str, str]:
    """``{relative POSIX name: sha256}`` of the regular files, skipping hidden files and directories
    (``.cache/`` from ``hf download --local-dir``, ``.git/``) that do not describe the model."""
    names = sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )
    return tree_digest(directory, names)


# ------------------------------------------------------------------------------------------------ gguf


def _resolve_gguf(spec: ModelSpec) -> ResolvedModel:
    assert spec.path is not None
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise ModelSourceError(f"GGUF file not found: {spec.path}")
    digest = sha256_file(path)
    return ResolvedModel("gguf", {"source": "gguf", "sha256": digest}, spec.path, path, None, {path.name: digest})


# --------------------------------------------------------------------------------------------- builtin


def _resolve_builtin(
    spec: ModelSpec, *, fetch: bool, cache_dir: str | os.PathLike[str] | None, progress: bool
) -> ResolvedModel:
    from miniverl.models.builtin import builtin_identity, fetch_builtin, get_pin

    assert spec.model_id is not None
    pin = get_pin(spec.model_id)
    identity = builtin_identity(pin.name)
    if not fetch:
        return ResolvedModel("builtin", identity, pin.name, None, dict(pin.config))
    result = fetch_builtin(pin.name, cache_dir=cache_dir, progress=progress)
    config = _read_config(result.path / "config.json", label=f"builtin model {pin.name}")
    return ResolvedModel("builtin", identity, pin.name, result.path, config)


# -------------------------------------------------------------------------------------------- adapters


def adapter_identity(adapter: AdapterSpec) -> dict[str, Any]:
    """Pinned identity of a frozen adapter, without downloading it.

    hub: ``{source, repo_id, revision}`` (a mutable revision is resolved through the hub cache);
    local: ``{source, sha256}`` of ``adapter_model.safetensors`` (the pin, checked against the file
    when the file is present).
    """
    if adapter.source == "hub":
        assert adapter.revision is not None
        revision = adapter.revision
        if not IMMUTABLE_REVISION.match(revision):
            revision = hub_snapshot(adapter.path, revision, allow_patterns=["adapter_config.json"], what="adapter").name
        return {"source": "hub", "repo_id": adapter.path, "revision": revision}
    weights = Path(adapter.path).expanduser() / ADAPTER_WEIGHTS
    if weights.is_file():
        digest = sha256_file(weights)
        if adapter.sha256 is not None and digest != adapter.sha256:
            raise ModelSourceError(
                f"adapter {adapter.path}: {ADAPTER_WEIGHTS} has sha256 {digest}, pinned {adapter.sha256}"
            )
        return {"source": "local", "sha256": digest}
    if adapter.sha256 is None:
        raise ModelSourceError(f"adapter directory not found or has no {ADAPTER_WEIGHTS}: {adapter.path}")
    return {"source": "local", "sha256": adapter.sha256}


def resolve_adapter(adapter: AdapterSpec) -> tuple[Path, dict[str, Any]]:
    """The adapter's local directory (downloaded for hub) and identity; local pins are checked."""
    if adapter.source == "hub":
        assert adapter.revision is not None
        folder = hub_snapshot(adapter.path, adapter.revision, allow_patterns=HUB_ADAPTER_PATTERNS, what="adapter")
        identity: dict[str, Any] = {"source": "hub", "repo_id": adapter.path, "revision": folder.name}
    else:
        folder = Path(adapter.path).expanduser()
        if not folder.is_dir():
            raise ModelSourceError(f"adapter directory not found: {adapter.path}")
        identity = adapter_identity(adapter)
    for name in ("adapter_config.json", ADAPTER_WEIGHTS):
        if not (folder / name).is_file():
            raise ModelSourceError(f"adapter {adapter.path} has no {name}")
    return folder, identity


# ---------------------------------------------------------------------------------------- architecture


def describe_architecture(resolved: ResolvedModel) -> dict[str, Any]:
    """Shapes for the memory plan, read from ``config.json`` (or GGUF metadata) only, never weights.

    Keys: model_type, vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, intermediate_size, tie_word_embeddings, param_count (estimate).
    """
    if resolved.config is not None:
        config = dict(resolved.config)
    elif resolved.source == "gguf" and resolved.path is not None:
        config = _gguf_config(resolved.path)
    elif resolved.path is not None and (resolved.path / "config.json").is_file():
        config = _read_config(resolved.path / "config.json", label=resolved.label)
    else:
        raise ModelSourceError(f"no config.json known for {resolved.label}; resolve it with fetch=True")
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        arch = {
            "model_type": str(config.get("model_type", "unknown")),
            "vocab_size": int(config["vocab_size"]),
            "hidden_size": hidden,
            "num_hidden_layers": int(config["num_hidden_layers"]),
            "num_attention_heads": heads,
            "num_key_value_heads": int(config.get("num_key_value_heads") or heads),
            "head_dim": int(config.get("head_dim") or hidden // heads),
            "intermediate_size": int(config["intermediate_size"]),
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelSourceError(f"config of {resolved.label} lacks a decoder-LM field: {exc}") from None
    arch["param_count"] = estimate_param_count(
        arch, attention_bias=bool(config.get("attention_bias", False)), qk_norm=arch["model_type"] == "qwen3"
    )
    return arch


def estimate_param_count(arch: Mapping[str, Any], *, attention_bias: bool = False, qk_norm: bool = False) -> int:
    """Parameters of a Llama-style decoder (embeddings, attention, gated MLP, RMSNorms, lm_head)."""
    hidden, vocab = int(arch["hidden_size"]), int(arch["vocab_size"])
    q_out = int(arch["num_attention_heads"]) * int(arch["head_dim"])
    kv_out = int(arch["num_key_value_heads"]) * int(arch["head_dim"])
    attention = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    if attention_bias:
        attention += q_out + 2 * kv_out
    if qk_norm:
        attention += 2 * int(arch["head_dim"])
    mlp = 3 * hidden * int(arch["intermediate_size"])
    per_layer = attention + mlp + 2 * hidden
    embeddings = vocab * hidden * (1 if arch["tie_word_embeddings"] else 2)
    return embeddings + int(arch["num_hidden_layers"]) * per_layer + hidden


def _gguf_config(path: Path) -> dict[str, Any]:
    """A config-like dict from GGUF metadata (the ``gguf`` package; no torch)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ModelSourceError("reading GGUF metadata needs the gguf package (the train extra)") from None
    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"cannot read GGUF file {path.name}: {_first_line(exc)}") from None

    def value(key: str) -> Any:
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    arch = value("general.architecture") or "llama"
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    hidden = value(f"{arch}.embedding_length")
    heads = value(f"{arch}.attention.head_count")
    return {
        "model_type": arch,
        "vocab_size": value(f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else None),
        "hidden_size": hidden,
        "num_hidden_layers": value(f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": value(f"{arch}.attention.head_count_kv") or heads,
        "head_dim": value(f"{arch}.attention.key_length"),
        "intermediate_size": value(f"{arch}.feed_forward_length"),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }


# ---------------------------------------------------------------------------------------------- helpers


def _read_config(path: Path, *, label: str) -> dict[str, Any]:
    try:
        config = loads_json(bounded.read_text(path, limit=bounded.MODEL_CONFIG_MAX_BYTES, what="a model config"))
    except FileNotFoundError:
        raise ModelSourceError(f"{label} has no config.json") from None
    except IsADirectoryError:
        raise ModelSourceError(f"{label}: config.json is a directory") from None
    except ValueError:  # malformed, duplicate keys, non-finite, not UTF-8
        raise ModelSourceError(f"{label}: config.json is not valid JSON") from None
    if not isinstance(config, dict):
        raise ModelSourceError(f"{label}: config.json is not a JSON object")
    return config


def _require_safetensors(directory: Path, *, label: str) -> None:
    if any(directory.glob("*.safetensors")):
        return
    if any(directory.glob("*.bin")) or any(directory.glob("*.pt")):
        raise ModelSourceError(f"{label} has only pickle weights (.bin/.pt); convert them to safetensors")
    raise ModelSourceError(f"{label} has no *.safetensors weights")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
