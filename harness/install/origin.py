"""Origin proof: the imported package and the ``miniverl`` executable come from the fresh venv."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from harness.core import registry
from harness.core.proc import Redactor, clean_env, last_line, run
from harness.core.records import InstalledFrom

# Runs as `<venv>/bin/python -I` from a temp dir outside the checkout; stdlib only.
ORIGIN_SCRIPT = r"""
import base64, hashlib, json, site, sys, sysconfig
from importlib import metadata
import miniverl
dist = metadata.distribution("miniverl")
ok = bad = missing = 0
bad_names = []
for f in dist.files or []:
    if not f.hash:
        continue
    p = f.locate()
    try:
        data = open(p, "rb").read()
    except OSError:
        missing += 1
        bad_names.append(str(f))
        continue
    digest = base64.urlsafe_b64encode(hashlib.new(f.hash.mode, data).digest()).rstrip(b"=").decode()
    if digest == f.hash.value:
        ok += 1
    else:
        bad += 1
        bad_names.append(str(f))
direct = dist.read_text("direct_url.json")
print(json.dumps({
    "file": miniverl.__file__,
    "purelib": sysconfig.get_paths()["purelib"],
    "scripts": sysconfig.get_paths()["scripts"],
    "prefix": sys.prefix,
    "isolated": bool(sys.flags.isolated),
    "user_site": bool(site.ENABLE_USER_SITE),
    "version": dist.version,
    "record_ok": ok, "record_bad": bad, "record_missing": missing, "record_bad_names": bad_names[:5],
    "direct_url": json.loads(direct) if direct else None,
    "pth": sorted(p.name for p in __import__("pathlib").Path(sysconfig.get_paths()["purelib"]).glob("*.pth")),
}))
"""


EXECUTABLE_CHECK = "origin_executable_under_venv"
# The origin checks are the registry's: those that need the package imported are all but the executable's.
IMPORT_CHECKS = tuple(c for c in registry.SMOKE_CHECKS if c.startswith("origin_") and c != EXECUTABLE_CHECK)
VENV, CHECKOUT = "<venv>", "<checkout>"


def probe_origin(venv: Path, cwd: Path, redact: Redactor) -> dict[str, Any]:
    """Run the probe with ``<venv>/bin/python -I`` and look up ``miniverl`` on the venv's PATH; returns what they
    found with every path redacted (``<venv>/...``): the evidence :func:`judge_origin` decides from."""
    info = _import_probe(venv / "bin" / "python", cwd, redact)
    bin_dir = venv / "bin"
    found = shutil.which("miniverl", path=str(bin_dir) + ":" + clean_env().get("PATH", ""))
    info["which"] = redact.text(str(Path(found).parent.resolve() / Path(found).name)) if found else None
    return info


def _import_probe(python: Path, cwd: Path, redact: Redactor) -> dict[str, Any]:
    """The probe script's findings (paths redacted), or ``{"import_error": why}``."""
    try:
        done = run([python, "-I", "-c", ORIGIN_SCRIPT], cwd=cwd, env=clean_env(), timeout=300)
    except OSError as exc:
        return {"import_error": f"cannot execute the venv's python: {exc.strerror}"}
    if done.returncode != 0:
        return {"import_error": redact.text(last_line(done.stderr))}
    info: dict[str, Any] = json.loads(done.stdout)
    for key in ("file", "purelib", "scripts", "prefix"):
        info[key] = redact.text(str(Path(info[key]).resolve()))
    direct = info.get("direct_url")
    if isinstance(direct, dict) and isinstance(direct.get("url"), str):
        direct["url"] = redact.text(direct["url"])
    info["record_bad_names"] = [redact.text(str(n)) for n in info.get("record_bad_names", [])]
    return info


def _under(path: Any, root: str) -> bool:
    return isinstance(path, str) and path.startswith(root + "/") and ".." not in path.split("/")


def judge_origin(info: dict[str, Any], version: str, wheel_sha256: str) -> dict[str, tuple[bool, str]]:
    """The origin checks, decided from the probe's redacted findings alone (the auditor re-runs this)."""
    checks: dict[str, tuple[bool, str]] = {}
    if "import_error" in info or not isinstance(info.get("file"), str):
        detail = f"python -I could not import miniverl from the venv: {str(info.get('import_error'))[:300]}"
        checks.update({name: (False, detail) for name in IMPORT_CHECKS})
    else:
        file, purelib = info["file"], info.get("purelib")
        checks["origin_installed_version"] = (
            info.get("version") == version,
            f"installed miniverl {str(info.get('version'))[:40]}, candidate {version}",
        )
        checks["origin_import_under_venv"] = (
            _under(purelib, VENV)
            and isinstance(purelib, str)
            and _under(file, purelib)
            and info.get("isolated") is True
            and info.get("user_site") is False,
            f"python -I imports {file[:160]} (purelib {str(purelib)[:120]}, "
            f"user site {'off' if info.get('user_site') is False else 'on'})",
        )
        checks["origin_not_checkout"] = (
            not file.startswith(CHECKOUT) and _under(file, VENV),
            "import path lies in the venv, outside the checkout",
        )
        direct = info.get("direct_url") if isinstance(info.get("direct_url"), dict) else {}
        assert isinstance(direct, dict)
        pth = info.get("pth") if isinstance(info.get("pth"), list) else ["<unreadable>"]
        assert isinstance(pth, list)
        dir_info = direct.get("dir_info")
        editable = isinstance(dir_info, dict) and bool(dir_info.get("editable"))
        editable = editable or any("__editable__" in str(p) for p in pth)
        checks["origin_not_editable"] = (
            not editable and isinstance(direct.get("archive_info"), dict),
            "installed from a wheel archive, not editable" if not editable else "an editable install was found",
        )
        ok, bad, missing = (info.get(k) for k in ("record_ok", "record_bad", "record_missing"))
        counted = all(isinstance(v, int) and not isinstance(v, bool) for v in (ok, bad, missing))
        checks["origin_record_hashes"] = (
            counted and ok > 0 and bad == 0 and missing == 0,  # type: ignore[operator]
            f"{ok} files match RECORD, {bad} differ, {missing} missing"
            + (f" ({', '.join(map(str, info.get('record_bad_names') or []))[:200]})" if not counted or bad else ""),
        )
        digest = wheel_hash(direct)
        url_name = str(direct.get("url", "")).rsplit("/", 1)[-1]
        checks["origin_wheel_hash"] = (
            digest == wheel_sha256,
            f"pip's direct_url.json records {url_name[:80]} sha256 {str(digest)[:16]}..., "
            f"candidate {wheel_sha256[:16]}...",
        )
    which = info.get("which")
    checks[EXECUTABLE_CHECK] = (
        which == f"{VENV}/bin/miniverl",
        f"which miniverl -> {str(which)[:160]}",
    )
    return checks


def wheel_hash(direct: dict[str, Any]) -> str | None:
    """The sha256 pip recorded in direct_url.json for the archive it installed."""
    archive = direct.get("archive_info") if isinstance(direct.get("archive_info"), dict) else {}
    assert isinstance(archive, dict)
    hashes = dict(archive.get("hashes") or {}) if isinstance(archive.get("hashes"), dict) else {}
    if isinstance(archive.get("hash"), str) and "=" in archive["hash"]:
        algo, _, value = archive["hash"].partition("=")
        hashes.setdefault(algo, value)
    value = hashes.get("sha256")
    return value if isinstance(value, str) else None


def origin_facts(info: dict[str, Any]) -> dict[str, str | int | bool | None]:
    """The probe's findings the qualification record keeps (``execution.origin``)."""
    direct = info.get("direct_url") if isinstance(info.get("direct_url"), dict) else {}
    assert isinstance(direct, dict)
    if "import_error" in info:
        return {"import_error": str(info["import_error"])[:300], "executable": info.get("which")}
    return {
        "import_file": info.get("file"),
        "purelib": info.get("purelib"),
        "record_files_verified": info.get("record_ok") if isinstance(info.get("record_ok"), int) else None,
        "installed_from": str(direct.get("url", "")).rsplit("/", 1)[-1] or None,
        "python_isolated": info.get("isolated") is True,
        "user_site": info.get("user_site") is True,
        "wheel_sha256": wheel_hash(direct),
        "executable": info.get("which"),
    }


def installed_from(facts: dict[str, str | int | bool | None]) -> InstalledFrom | None:
    """The binding every CLI invocation carries: the wheel sha256 pip recorded (direct_url.json) and the import and
    executable origins the proof found; None when the proof could not establish them."""
    wheel, file, exe = facts.get("wheel_sha256"), facts.get("import_file"), facts.get("executable")
    if not (isinstance(wheel, str) and isinstance(file, str) and isinstance(exe, str)):
        return None
    try:
        return InstalledFrom(wheel_sha256=wheel, import_origin=file, executable=exe)
    except ValueError:
        return None
