"""A vLLM site (``pip install --target``, as ``scripts/device/vllm.sh install`` builds it) made visible to the
qualification's CLI processes, after everything the venv's own interpreter already has on ``sys.path``.

Why after, where ``vllm.sh smoke`` put its site first: the smoke runs the image's python, whose site has no numpy
2.3.5, cuda-bindings or setuptools of the versions vLLM asks for, so the site had to win there. A qualification
qualifies the candidate's installed closure (the known-good pins the install judge checked); a site that shadowed
its numpy or pydantic would run the workloads on other packages than the ones recorded. After the venv's site, the
site only supplies what the venv lacks (vllm itself and the packages only vLLM needs); where vLLM cannot work with
the candidate's versions, its run fails and the judge fails it: never a silently different stack.

``PYTHONPATH`` entries precede the interpreter's own site directories, so "after" is written as the venv
interpreter's whole ``sys.path`` (as it starts with a clean environment) followed by the site; ``site`` drops the
repeats, leaving the venv's order untouched with the site last.

The site's files are digested by the harness (sha256 of each file, by path) and the digest goes into the
qualification record, so an auditor knows which vLLM the evidence came from.

Torch-free and miniverl-free, like all of the harness.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import UsageError
from harness.core.proc import clean_env, run

#: bytecode Python writes beside the sources on import: derived, and written by any earlier use of the site, so
#: left out of the digest (the qualification's own processes never write it: PYTHONDONTWRITEBYTECODE)
_DERIVED_DIRS = {"__pycache__"}
_DIST_INFO = re.compile(r"vllm-([0-9][0-9A-Za-z.+-]*)\.dist-info")


@dataclass(frozen=True)
class VllmSite:
    path: Path
    sha256: str  # sha256 of the "sha256  bytes  relative-path" lines of every file, sorted by path
    files: int
    bytes: int
    version: str | None  # from the vllm-*.dist-info folder's name (None: the site has none)

    def facts(self) -> dict[str, str | int | None]:
        """What the qualification records of the site (never its local path)."""
        return {
            "vllm_site_sha256": self.sha256,
            "vllm_site_files": self.files,
            "vllm_site_bytes": self.bytes,
            "vllm_site_version": self.version,
        }


def _digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_site(site: Path) -> VllmSite:
    """The site's digest; refused in one line where it is not a directory holding a ``vllm`` package, or holds
    something other than directories and regular files."""
    flag = "--vllm-site"
    if not site.is_dir():
        raise UsageError(f"{flag} {str(site)!r} is not a directory", check="usage")
    if not (site / "vllm" / "__init__.py").is_file():
        raise UsageError(f"{flag} {str(site)!r} holds no vllm package (vllm/__init__.py)", check="usage")
    lines: list[str] = []
    total = 0
    for root, dirs, names in os.walk(site):
        dirs[:] = sorted(d for d in dirs if d not in _DERIVED_DIRS)
        for entry in [*dirs, *names]:
            path = Path(root) / entry
            if path.is_symlink():
                rel = path.relative_to(site).as_posix()
                raise UsageError(
                    f"{flag}: {rel} is a symlink; the site's digest names regular files only", check="usage"
                )
        for name in names:
            path = Path(root) / name
            if not path.is_file():
                rel = path.relative_to(site).as_posix()
                raise UsageError(f"{flag}: {rel} is not a regular file", check="usage")
            size = path.stat().st_size
            total += size
            lines.append(f"{_digest_file(path)}  {size}  {path.relative_to(site).as_posix()}\n")
    lines.sort(key=lambda line: line.split("  ", 2)[2])
    versions = sorted(m.group(1) for d in site.iterdir() if (m := _DIST_INFO.fullmatch(d.name)) and d.is_dir())
    return VllmSite(
        path=site,
        sha256=hashlib.sha256("".join(lines).encode("utf-8")).hexdigest(),
        files=len(lines),
        bytes=total,
        version=versions[0] if len(versions) == 1 else None,
    )


def python_path(python: Path, site: Path, *, work: Path) -> str:
    """``PYTHONPATH`` for the venv's processes: the venv interpreter's own ``sys.path`` (clean environment), then
    the site."""
    code = "import json, sys; print(json.dumps(sys.path[1:]))"
    done = run([python, "-c", code], cwd=work, env=clean_env(), timeout=120)
    try:
        entries = json.loads(done.stdout.decode("utf-8")) if done.returncode == 0 else None
    except ValueError:
        entries = None
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise UsageError(f"{python.name} could not print its sys.path (exit {done.returncode})", check="usage")
    return os.pathsep.join([*(e for e in entries if e), str(site)])
