"""Origin proof: the imported package and the ``miniverl`` executable come from the fresh venv."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.proc import REPO_ROOT, Redactor, clean_env, last_line, run

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


def prove_origin(
    venv: Path, cwd: Path, version: str, wheel_sha256: str, redact: Redactor
) -> tuple[dict[str, tuple[bool, str]], dict[str, str | int | bool | None]]:
    """Run the origin script; returns ({check: (passed, detail)}, facts for the record)."""
    python = venv / "bin" / "python"
    done = run([python, "-I", "-c", ORIGIN_SCRIPT], cwd=cwd, env=clean_env(), timeout=300)
    checks: dict[str, tuple[bool, str]] = {}
    if done.returncode != 0:
        detail = f"python -I could not import miniverl from the venv: {redact.text(last_line(done.stderr))}"
        for name in (
            "origin_installed_version",
            "origin_import_under_venv",
            "origin_not_checkout",
            "origin_not_editable",
            "origin_record_hashes",
            "origin_wheel_hash",
        ):
            checks[name] = (False, detail)
        facts: dict[str, str | int | bool | None] = {"import_error": detail}
    else:
        info = json.loads(done.stdout)
        file, purelib = Path(info["file"]).resolve(), Path(info["purelib"]).resolve()
        venv_root = venv.resolve()
        checks["origin_installed_version"] = (
            info["version"] == version,
            f"installed miniverl {info['version']}, candidate {version}",
        )
        checks["origin_import_under_venv"] = (
            file.is_relative_to(purelib)
            and purelib.is_relative_to(venv_root)
            and info["isolated"]
            and not info["user_site"],
            f"python -I imports {redact.text(str(file))} (purelib {redact.text(str(purelib))}, "
            f"user site {'on' if info['user_site'] else 'off'})",
        )
        checks["origin_not_checkout"] = (not file.is_relative_to(REPO_ROOT), "import path lies outside the checkout")
        direct = info["direct_url"] or {}
        editable = bool(direct.get("dir_info", {}).get("editable")) or any("__editable__" in p for p in info["pth"])
        checks["origin_not_editable"] = (
            not editable and "archive_info" in direct,
            "installed from a wheel archive, not editable" if not editable else "an editable install was found",
        )
        checks["origin_record_hashes"] = (
            info["record_ok"] > 0 and info["record_bad"] == 0 and info["record_missing"] == 0,
            f"{info['record_ok']} files match RECORD, {info['record_bad']} differ, {info['record_missing']} missing"
            + (f" ({', '.join(info['record_bad_names'])})" if info["record_bad_names"] else ""),
        )
        archive = direct.get("archive_info", {})
        hashes = dict(archive.get("hashes") or {})
        if "hash" in archive and "=" in archive["hash"]:
            algo, _, value = archive["hash"].partition("=")
            hashes.setdefault(algo, value)
        url_name = str(direct.get("url", "")).rsplit("/", 1)[-1]
        checks["origin_wheel_hash"] = (
            hashes.get("sha256") == wheel_sha256,
            f"pip's direct_url.json records {url_name} sha256 {hashes.get('sha256', 'none')[:16]}...",
        )
        facts = {
            "import_file": redact.text(str(file)),
            "purelib": redact.text(str(purelib)),
            "record_files_verified": int(info["record_ok"]),
            "installed_from": url_name or None,
            "python_isolated": bool(info["isolated"]),
            "user_site": bool(info["user_site"]),
        }
    bin_dir = venv / "bin"
    found = shutil.which("miniverl", path=str(bin_dir) + ":" + clean_env().get("PATH", ""))
    exe_ok = found is not None and Path(found).resolve().parent == bin_dir.resolve()
    checks["origin_executable_under_venv"] = (
        exe_ok,
        f"which miniverl -> {redact.text(found) if found else 'not found'}",
    )
    facts["executable"] = redact.text(found) if found else None
    return checks, facts
