"""The part of ray's wheel that ``import verl`` and ``miniverl diagnose`` load, for a device call's carry.

ray 2.60.0's cp312 wheel is 79 MB; three quarters of it are the cluster (the raylet and GCS server executables,
the Java jar, the dashboard's web client, the runtime-env agent's vendored aiohttp) and libraries verl's import
never touches (rllib, tune, serve, train, data, llm). Importing verl loads ``ray`` itself (``verl.protocol``), whose
``_raylet.so`` stays. Nothing is rebuilt: every kept file is the wheel's own bytes.

    python ray_subset.py make RAY.whl OUT.tar.xz OUT.json   # here: the kept members + a manifest of their sha256
    python ray_subset.py make --cluster RAY.whl OUT.tar.xz OUT.json   # the same, keeping what a local cluster runs
    python ray_subset.py check SITE MANIFEST.json           # device: every kept file, by sha256, and the RECORD
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import lzma
import sys
import tarfile
import zipfile
from pathlib import Path

#: what neither subset keeps: the Java jar and the libraries verl never imports
LIBRARIES = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/serve/", "ray/train/", "ray/data/", "ray/llm/")
#: the import subset also leaves out the cluster (the manifest records this order)
LEFT_OUT = (
    LIBRARIES[0],
    "ray/core/src/ray/gcs/gcs_server",
    "ray/core/src/ray/raylet/raylet",
    "ray/dashboard/client/",
    "ray/_private/runtime_env/agent/thirdparty_files/",
    *LIBRARIES[1:],
)
#: what `ray.init()` on one node starts beside the import (verl_launch.py: verl's own launch): the raylet, the GCS
#: server, the runtime-env agent's vendored aiohttp and the dashboard's web client stay (where the dashboard's
#: dependencies are installed, a head without its client waited ~60 s in `ray.init()` on CPU)
CLUSTER_LEFT_OUT = LIBRARIES


def make(wheel: Path, out: Path, manifest: Path, left_out: tuple[str, ...] = LEFT_OUT) -> None:
    kept: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as z, lzma.open(out, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            if info.is_dir() or info.filename.startswith(left_out):
                continue
            data = z.read(info)
            kept[info.filename] = hashlib.sha256(data).hexdigest()
            member = tarfile.TarInfo(info.filename)
            member.size, member.mtime, member.mode = len(data), 0, 0o755 if info.filename.endswith(".so") else 0o644
            tar.addfile(member, io.BytesIO(data))
    doc = {
        "wheel": wheel.name,
        "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "left_out": list(left_out),
        "files": kept,
    }
    manifest.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"subset: {len(kept)} files of {wheel.name}, {out.stat().st_size} bytes")


def check(site: Path, manifest: Path) -> None:
    doc = json.loads(manifest.read_text())
    bad = [name for name, digest in doc["files"].items() if _sha256(site / name) != digest]
    record = next(name for name in doc["files"] if name.endswith(".dist-info/RECORD"))
    recorded = {}
    with (site / record).open(newline="") as f:
        for row in csv.reader(f):
            if len(row) == 3 and row[1].startswith("sha256="):
                recorded[row[0]] = base64.urlsafe_b64decode(row[1][7:] + "==").hex()
    bad += [name for name in doc["files"] if name != record and recorded.get(name) != doc["files"][name]]
    if bad:
        sys.exit(f"subset: {len(bad)} files differ from {doc['wheel']} (first: {bad[0]})")
    print(f"subset: {len(doc['files'])} files equal {doc['wheel']}'s own (RECORD and manifest)")


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


if __name__ == "__main__":
    if sys.argv[1:2] == ["make"] and len(sys.argv) == 5:
        make(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1:3] == ["make", "--cluster"] and len(sys.argv) == 6:
        make(Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]), CLUSTER_LEFT_OUT)
    elif sys.argv[1:2] == ["check"] and len(sys.argv) == 4:
        check(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit("usage: ray_subset.py make [--cluster] RAY.whl OUT.tar.xz OUT.json | check SITE MANIFEST.json")
