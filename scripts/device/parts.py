"""A device stage as one tar cut into parts that each fit a call beside the tracked tree (``cut``, ``plan``: here),
and the parts parked between calls and joined again, every byte checked by sha256 (``park``, ``join``: device).
Shared by the device scripts (``agreement.py``, ``verl_launch.py``); a sibling script, not a package."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from steps import sha256

CALL_BYTES = 64 * 2**20  # what one device call may send: the tracked tree and its carry
MARGIN_BYTES = 2**20  # room for a few commits more between staging and the calls
MANIFEST = "manifest.json"


class Refused(Exception):
    """One line for the operator: what is wrong and nothing else."""


def tree_bytes(repo: Path) -> int:
    """The bytes of the tracked tree a device call sends beside its carry."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    files = (repo / name.decode() for name in listed.split(b"\0") if name)
    return sum(f.stat().st_size for f in files if f.is_file())


def cut(stage: Path, members: dict[str, Path], repo: Path, **recorded: Any) -> dict[str, Any]:
    """``members`` (name in the tar -> file) as one uncompressed tar (wheels and xz are compressed already) cut into
    ``stage/N/part``, each beside the manifest: the tar's and every part's sha256, and ``recorded``."""
    for old in stage.glob("[0-9]*"):
        shutil.rmtree(old)
    joined = stage / "stage.tar"
    with tarfile.open(joined, "w") as tar:
        for name, path in members.items():
            tar.add(path, arcname=name)
    data = joined.read_bytes()
    joined.unlink()
    budget = CALL_BYTES - tree_bytes(repo) - MARGIN_BYTES
    count = math.ceil(len(data) / budget)
    size = math.ceil(len(data) / count)
    parts = {}
    for number in range(1, count + 1):
        (stage / str(number)).mkdir()
        piece = stage / str(number) / "part"
        piece.write_bytes(data[(number - 1) * size : number * size])
        parts[str(number)] = sha256(piece)
    manifest = {"stage_sha256": hashlib.sha256(data).hexdigest(), "parts": parts, **recorded}
    for name in parts:
        (stage / name / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"staged {len(members)} files, {len(data)} bytes, in {count} parts of <= {size} (budget {budget} a call)")
    return manifest


def plan(stage: Path, repo: Path, label: str) -> None:
    """Each call's bytes: the tracked tree and one part."""
    tree = tree_bytes(repo)
    parts = sorted(stage.glob("[0-9]*"), key=lambda p: int(p.name))
    if not parts:
        raise Refused(f"plan: nothing staged in {stage}")
    print(f"tracked tree: {tree} bytes; {len(parts)} parts; limit {CALL_BYTES} a call")
    for part in parts:
        sent = tree + sum(f.stat().st_size for f in part.iterdir())
        print(f"call {part.name}: carry {label}/{part.name}: {sent} bytes{'' if sent <= CALL_BYTES else ' OVER'}")


def park(stage: Path, number: str, target: Path, label: str) -> dict[str, Any]:
    """Part ``number`` (carried as ``stage/number``), checked, into ``target``; a part of another stage refuses."""
    source = stage / number
    if not (source / "part").is_file() or not (source / MANIFEST).is_file():
        raise Refused(f"carry {number}: {label}/{number} did not travel with this call")
    manifest: dict[str, Any] = json.loads((source / MANIFEST).read_text())
    if sha256(source / "part") != manifest["parts"].get(number):
        raise Refused(f"carry {number}: part {number} is not the staged one (sha256 differs)")
    target.mkdir(parents=True, exist_ok=True)
    held = target / MANIFEST
    if held.is_file() and json.loads(held.read_text())["stage_sha256"] != manifest["stage_sha256"]:
        raise Refused(f"carry {number}: the parts parked in {target} are of another stage; rm -rf it, carry from 1")
    shutil.copyfile(source / "part", target / f"part-{number}.tmp")
    (target / f"part-{number}.tmp").rename(target / f"part-{number}")
    shutil.copyfile(source / MANIFEST, held)
    have = sorted(p.name for p in target.glob("part-[0-9]*") if not p.name.endswith(".tmp"))
    print(f"parked part {number}; parts here: {', '.join(have)} of {len(manifest['parts'])}")
    return manifest


def join(target: Path, into: Path, what: str) -> dict[str, Any]:
    """Every parked part joined, the tar checked against the stage's sha256 and unpacked into ``into``; the
    manifest. ``what`` names the step in a refusal."""
    if not (target / MANIFEST).is_file():
        raise Refused(f"{what}: no parts parked (the machine was replaced?): carry every part again")
    manifest: dict[str, Any] = json.loads((target / MANIFEST).read_text())
    missing = [n for n in manifest["parts"] if not (target / f"part-{n}").is_file()]
    if missing:
        raise Refused(f"{what}: parts {', '.join(missing)} are not parked: carry them again")
    digest = hashlib.sha256()
    joined = target / "stage.tar"
    with joined.open("wb") as out:
        for number in sorted(manifest["parts"], key=int):
            data = (target / f"part-{number}").read_bytes()
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != manifest["stage_sha256"]:
        raise Refused(f"{what}: the joined parts are not the staged tar (sha256 differs)")
    shutil.rmtree(into, ignore_errors=True)
    with tarfile.open(joined) as tar:
        tar.extractall(into, filter="data")
    joined.unlink()
    return manifest
