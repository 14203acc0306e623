"""Hub models pinned file by file: a hub revision plus the sha256 of every file miniverl loads from it.

A pin is a JSON file in ``miniverl/models/pins/`` (shipped in the wheel, so the installed CLI verifies what it
downloads; its JSON Schema is ``manifests/miniverl/hub-pin.schema.json``). A ``source: hub`` model spec whose
``model_id`` and ``revision`` match a pin is fetched through this module instead of a plain ``snapshot_download``:

- each pinned file is downloaded with ``hf_hub_download(repo_id, filename, revision=<40-hex>)`` from
  ``HF_ENDPOINT`` (read at call time) into a temp directory beside the cache entry;
- the hub must answer with that commit (``X-Repo-Commit``), and each file must have its pinned size and sha256;
- only then is the directory renamed to ``$MINIVERL_CACHE/hub/<name>/<revision[:16]>/``. Any refusal (a wrong
  hash, an unknown revision, a missing file) names the file or revision and leaves nothing in the cache.

A cached entry is re-hashed on each use; one that no longer matches its pin is removed and fetched again.
This module never imports torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from miniverl.canonical import fsync_tree, sha256_file, sha256_json
from miniverl.errors import ModelSourceError
from miniverl.models.cache import cache_root

PINS_DIR = Path(__file__).with_name("pins")
PIN_RECORD = "miniverl-hub-pin.json"
_TRUE = {"1", "on", "yes", "true"}

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Commit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{40}$")]
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


class PinnedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: Sha256
    size: Annotated[int, Field(ge=0)] | None = None
    """Bytes, where the source that recorded the sha256 also gave the size (checked when known)."""


class HubPin(BaseModel):
    """A hub repository at one commit, and the sha256 of every file miniverl takes from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["miniverl-hub-pin/1"] = "miniverl-hub-pin/1"
    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9.-]*$")]
    repo_id: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")]
    revision: Commit
    role: Literal["causal_lm", "sequence_classifier"]
    revision_source: str = Field(min_length=1, description="Where the revision and the file digests were taken from")
    files: dict[str, PinnedFile]

    @model_validator(mode="after")
    def _file_names(self) -> HubPin:
        if "config.json" not in self.files:
            raise ValueError(f"pin {self.name}: files must include config.json")
        if not any(name.endswith(".safetensors") for name in self.files):
            raise ValueError(f"pin {self.name}: files must include safetensors weights")
        bad = [name for name in self.files if not _SAFE_NAME.match(name) or ".." in name.split("/")]
        if bad:
            raise ValueError(f"pin {self.name}: file names must be plain relative paths, not {bad}")
        return self

    @property
    def label(self) -> str:
        return f"{self.repo_id}@{self.revision}"

    def files_sha256(self) -> str:
        """The digest a plan's identity names: sha256 of the canonical ``{file: sha256}`` map."""
        return sha256_json({name: pinned.sha256 for name, pinned in sorted(self.files.items())})


def load_pin(path: Path) -> HubPin:
    try:
        return HubPin.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, ValidationError) as exc:
        raise ModelSourceError(f"hub pin {path.name} is not a valid pin: {str(exc).splitlines()[0]}") from None


@cache
def hub_pins() -> Mapping[str, HubPin]:
    """The pins shipped with miniverl, by name."""
    pins = {}
    for path in sorted(PINS_DIR.glob("*.json")):
        pin = load_pin(path)
        if path.stem != pin.name:
            raise ModelSourceError(f"hub pin {path.name} names itself {pin.name!r}")
        pins[pin.name] = pin
    return MappingProxyType(pins)


def pin_for(repo_id: str, revision: str | None) -> HubPin | None:
    """The shipped pin of ``repo_id`` at ``revision``, if miniverl records one."""
    return next((p for p in hub_pins().values() if p.repo_id == repo_id and p.revision == revision), None)


def pinned_cache_dir(pin: HubPin, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return cache_root(cache_dir) / "hub" / pin.name / pin.revision[:16]


def pin_identity(pin: HubPin) -> dict[str, str]:
    return {"source": "hub", "model_id": pin.repo_id, "revision": pin.revision, "files_sha256": pin.files_sha256()}


def _offline() -> bool:
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _mismatch(pin: HubPin, directory: Path) -> str | None:
    """Why ``directory`` is not exactly the pinned files (plus the pin record), or None when it is."""
    present = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())
    extra = sorted(set(present) - set(pin.files) - {PIN_RECORD})
    if extra:
        return f"holds files the pin does not list: {extra[:5]}"
    for name, pinned in sorted(pin.files.items()):
        why = _file_mismatch(pin, name, pinned, directory / name)
        if why is not None:
            return why
    return None


def _file_mismatch(pin: HubPin, name: str, pinned: PinnedFile, path: Path) -> str | None:
    if not path.is_file() or path.is_symlink():
        return f"{name} is missing"
    size = path.stat().st_size
    if pinned.size is not None and size != pinned.size:
        return f"{name} has {size} bytes, the pin records {pinned.size}"
    digest = sha256_file(path)
    if digest != pinned.sha256:
        return f"{name} has sha256 {digest}, the pin records {pinned.sha256}"
    return None


def cached_pinned(pin: HubPin, cache_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The cached directory when it holds exactly the pinned files, else None."""
    target = pinned_cache_dir(pin, cache_dir)
    return target if target.is_dir() and _mismatch(pin, target) is None else None


def fetch_pinned(pin: HubPin, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The verified cached directory of ``pin``, downloading it first when it is not cached (or no longer matches).

    Raises :class:`ModelSourceError` naming the file or revision that was refused; the cache is then left as it
    was before the call (a stale entry that failed verification is removed).
    """
    target = pinned_cache_dir(pin, cache_dir)
    if target.exists():
        why = _mismatch(pin, target) if target.is_dir() else "is not a directory"
        if why is None:
            return target
        _remove(target)
    if _offline():
        raise ModelSourceError(
            f"model {pin.label} ({pin.name}) is not in the miniverl cache and HF_HUB_OFFLINE is set; "
            "fetch it on a connected machine (`miniverl models fetch " + pin.name + "`) or unset HF_HUB_OFFLINE"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        built = work / "model"
        built.mkdir()
        for name, pinned in sorted(pin.files.items()):
            downloaded = _download(pin, name, work / "hub")
            why = _file_mismatch(pin, name, pinned, downloaded)
            if why is not None:
                raise ModelSourceError(f"model {pin.label}: {why}; refused, nothing was cached")
            (built / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(downloaded, built / name)
        (built / PIN_RECORD).write_text(json.dumps(pin.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
        fsync_tree(built)
        try:
            os.rename(built, target)
        except OSError:
            if not target.is_dir():
                raise
            # Another process published the same pin between our check and rename: its copy is verified below.
        why = _mismatch(pin, target)
        if why is not None:
            raise ModelSourceError(f"model {pin.label}: the cached copy {why}")
        return target
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _remove(target: Path) -> None:
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        target.unlink()


def _download(pin: HubPin, name: str, hub_cache: Path) -> Path:
    """One pinned file from the hub at the pinned commit; the hub must name that commit for it."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    label = f"model {pin.label}"
    try:
        path = Path(
            hf_hub_download(
                pin.repo_id,
                name,
                revision=pin.revision,
                cache_dir=str(hub_cache),
                endpoint=os.environ.get("HF_ENDPOINT") or None,
            )
        )
    except RevisionNotFoundError:
        raise ModelSourceError(f"{label}: revision {pin.revision} not found in {pin.repo_id} on the hub") from None
    except (RepositoryNotFoundError, GatedRepoError):
        raise ModelSourceError(f"{label}: repository {pin.repo_id} not found or not accessible on the hub") from None
    except EntryNotFoundError:
        raise ModelSourceError(f"{label}: the hub has no {name} at revision {pin.revision}") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelSourceError(f"{label}: {name} could not be downloaded: {first}") from None
    snapshot = path
    for _ in Path(name).parts:
        snapshot = snapshot.parent
    if snapshot.name != pin.revision:
        raise ModelSourceError(
            f"{label}: the hub answered {name} from commit {snapshot.name}, not the pinned revision {pin.revision}"
        )
    return path.resolve()  # the snapshot entry links to a content-addressed blob
