"""GGUF files: dequantized loading, tokenizer repair, and conversion to a cached safetensors directory.

transformers reads a GGUF's weights and tokenizer itself; we always pass
``GgufConfig(dequantize=True)`` so the result is a plain float model (without it transformers
attaches a GGUF quantizer that blocks ``save_pretrained`` and training). bitsandbytes cannot be
combined with a GGUF source, so NF4 for a GGUF model goes through :func:`materialize_gguf`
(a cached safetensors directory) and is quantized from there.

Importing this module does not import torch; the functions do.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miniverl.canonical import sha256_file
from miniverl.errors import ModelSourceError
from miniverl.models.cache import (
    CacheMismatch,
    TokenizerFix,
    build_cached_dir,
    model_cache_dir,
    verify_cached_dir,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CACHE_DTYPE = "bfloat16"
RECIPE = 1
"""Version of what :func:`convert_gguf` writes; bump it when that changes, so caches are rebuilt."""


def load_gguf(
    gguf_path: Path, *, dtype: Any = None, attn_implementation: str | None = None, progress: bool = True
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Dequantize ``gguf_path`` into a float model (``dtype``, default float32) and its tokenizer.

    The tokenizer is not repaired here; see :func:`repair_tokenizer`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    directory, name = str(gguf_path.parent), gguf_path.name
    try:
        with quiet_progress(not progress):
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(
                directory,
                gguf_file=name,
                quantization_config=GgufConfig(dequantize=True),
                dtype=dtype,
                attn_implementation=attn_implementation,
            )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelSourceError(f"cannot load GGUF file {gguf_path.name}: {_first_line(exc)}") from None
    return model, tokenizer


@contextlib.contextmanager
def quiet_progress(quiet: bool = True) -> Iterator[None]:
    """Silence transformers' progress bars, including the raw tqdm bar of its GGUF reader."""
    if not quiet:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    gguf_utils: Any = None
    with contextlib.suppress(ImportError):  # transformers without GGUF support
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    original = getattr(gguf_utils, "tqdm", None)
    if original is not None:
        gguf_utils.tqdm = _no_progress
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original
        if was_enabled:
            hf_logging.enable_progress_bar()


def _no_progress(iterable: Any, *args: Any, **kwargs: Any) -> Any:
    return iterable


def repair_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    *,
    eos_token: str | None = None,
    pad_token: str | None = None,
) -> TokenizerFix:
    """Make the tokenizer's eos/pad agree with the model, in place, and say what changed.

    transformers' GGUF tokenizer conversion can get ``eos_token`` wrong (SmolLM2's comes out as
    ``<|im_start|>``, id 1, while the GGUF metadata and the model config say id 2) and drops the
    pad token. The model config's ``eos_token_id`` is authoritative unless ``eos_token`` names the
    token explicitly. ``pad_token``, if given, must be an existing token; otherwise an existing pad
    token is kept, or eos is used. ``model.config`` and ``model.generation_config`` get the same
    eos/pad ids so that generation pads finished rows with the tokenizer's pad id.
    """
    notes: list[str] = []
    if eos_token is None:
        config_eos = _first_id(model.config.eos_token_id)
        if config_eos is not None:
            eos_token = str(tokenizer.convert_ids_to_tokens(config_eos))
    if eos_token is not None and tokenizer.eos_token != eos_token:
        _require_token(tokenizer, eos_token, "eos")
        notes.append(f"eos_token {tokenizer.eos_token!r} -> {eos_token!r} (model config eos_token_id)")
        tokenizer.eos_token = eos_token
    if tokenizer.eos_token is None:
        raise ModelSourceError("GGUF tokenizer has no eos token and the model config names none")
    if pad_token is not None and tokenizer.pad_token != pad_token:
        _require_token(tokenizer, pad_token, "pad")
        notes.append(f"pad_token {tokenizer.pad_token!r} -> {pad_token!r}")
        tokenizer.pad_token = pad_token
    elif tokenizer.pad_token is None:
        notes.append(f"pad_token None -> eos {tokenizer.eos_token!r}")
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        # The GGUF conversion turns this WordPiece-style cleanup on; for a BPE tokenizer it deletes
        # spaces before punctuation when decoding (the upstream SmolLM2 tokenizer has it off).
        notes.append("clean_up_tokenization_spaces True -> False")
        tokenizer.clean_up_tokenization_spaces = False
    eos_id, pad_id = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
    for config in (model.config, model.generation_config):
        if config is not None:
            config.eos_token_id = eos_id
            config.pad_token_id = pad_id
    return TokenizerFix(
        eos_token=str(tokenizer.eos_token),
        eos_token_id=eos_id,
        pad_token=str(tokenizer.pad_token),
        pad_token_id=pad_id,
        notes=notes,
    )


def convert_gguf(
    gguf_path: Path,
    out_dir: Path,
    *,
    eos_token: str | None = None,
    pad_token: str | None = None,
    dtype: str = CACHE_DTYPE,
    progress: bool = True,
) -> TokenizerFix:
    """Dequantize ``gguf_path``, repair its tokenizer, cast to ``dtype`` and save both to ``out_dir``."""
    import torch

    model, tokenizer = load_gguf(gguf_path, dtype=torch.float32, progress=progress)
    fix = repair_tokenizer(tokenizer, model, eos_token=eos_token, pad_token=pad_token)
    model = model.to(getattr(torch, dtype))
    model.config.name_or_path = ""
    with quiet_progress(not progress):
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return fix


def converted_with() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("transformers", "torch", "gguf")}


def materialize_gguf(
    gguf_path: Path,
    *,
    sha256: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> Path:
    """A verified cached safetensors directory for an arbitrary GGUF file (for NF4 loading)."""
    digest = sha256 or sha256_file(gguf_path)
    target = model_cache_dir("gguf", digest, cache_dir)
    expect: dict[str, object] = {"source": "gguf", "gguf_sha256": digest, "dtype": CACHE_DTYPE, "recipe": RECIPE}
    try:
        verify_cached_dir(target, expect=expect)
        return target
    except CacheMismatch:
        pass

    def write(tmp: Path) -> dict[str, object]:
        fix = convert_gguf(gguf_path, tmp, progress=progress)
        return {
            "source": "gguf",
            "name": "gguf",
            "gguf_sha256": digest,
            "gguf_size": gguf_path.stat().st_size,
            "dtype": CACHE_DTYPE,
            "recipe": RECIPE,
            "tokenizer": fix.model_dump(),
            "converted_with": converted_with(),
        }

    build_cached_dir(target, write)
    return target


def _require_token(tokenizer: Any, token: str, role: str) -> None:
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or (token_id == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise ModelSourceError(f"{role} token {token!r} is not in the GGUF tokenizer's vocabulary")


def _first_id(value: Any) -> int | None:
    if isinstance(value, list | tuple):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
