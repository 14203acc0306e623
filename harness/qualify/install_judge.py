"""The install phase's judge: clean worktree, wheel hash, fresh venv, install, pip check, stack and Python, decided
from the raw output the harness captured (``evidence/install/``), never from the record's own fields.

The harness keeps, redacted of local paths, what each command printed: ``git rev-parse HEAD`` and ``git status
--porcelain`` of the checkout, the wheel's sha256 taken right before pip ran, pip's own ``--report`` of what it
installed from which file with which hash, the new venv's ``pyvenv.cfg`` and ``pip freeze --all --local`` before the
install, ``pip inspect`` and ``pip check`` after it, ``python -c 'import sys; print(sys.version)'`` of the venv, and
``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv`` (absent where the machine has none).
Each parser is strict, so another command's output in a file's place is refused, not misread. What the judge knows
besides the files comes from its caller: the candidate (commit, version, wheel) from the verified manifest, and the
known-good pins and Python from the verified descriptor.
"""

from __future__ import annotations

import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, Marker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

from harness.build.candidate import normalize
from harness.build.stacks import parse_nvidia_smi_csv, stack_mismatches
from harness.core.records import COMMIT_HEX, SHA256_HEX, GpuFacts

# role -> file name under evidence/install/ (the qualification binds each under its role)
INSTALL_FILES = {
    "git_head": "git-rev-parse-head.txt",
    "git_status": "git-status-porcelain.txt",
    "wheel_sha256": "wheel-sha256.txt",
    "pip_report": "pip-install-report.json",
    "pyvenv_cfg": "pyvenv.cfg",
    "venv_before_install": "pip-freeze-before-install.txt",
    "pip_inspect": "pip-inspect.json",
    "pip_check": "pip-check.txt",
    "python_version": "python-version.txt",
    "nvidia_smi": "nvidia-smi.csv",
}
# Every smoke binds these; nvidia_smi only where the machine has nvidia-smi (a CUDA profile's gpu_identity needs it).
REQUIRED_INSTALL_ROLES = tuple(r for r in INSTALL_FILES if r != "nvidia_smi")
CAPTURE_LIMIT_BYTES = 64 << 20  # pip inspect over a machine's site-packages is a few MB
# What `python -m venv` seeds; anything else before the install means the venv was not fresh.
VENV_SEED = {"pip", "setuptools", "wheel"}
PIP_CHECK_CLEAN = "No broken requirements found."
_PIP_CHECK_LINE = re.compile(
    r"^\S+ \S+ (requires \S+, which is not installed\.|has requirement .+, but you have \S+ \S+\.|"
    r"is not supported on this platform)$"
)
_PORCELAIN = re.compile(r"^[ MTADRCU?!]{2} \S.*$")
_SYS_VERSION = re.compile(r"^(\d+\.\d+\.\d+)\S* \(.*\)")
_FREEZE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


@dataclass(frozen=True)
class InstallBasis:
    """What the judge takes from outside the files: all of it verified by the caller before."""

    commit: str
    version: str
    wheel_filename: str
    wheel_sha256: str
    extras: tuple[str, ...]
    pins: dict[str, str]
    python_pin: str | None  # the known-good descriptor's Python, to the precision it gives ("3.11" or "3.12.13")
    index_urls: tuple[str, ...] = ()  # the descriptor's extra index URLs: where a local-version pin must come from


@dataclass
class InstallFacts:
    """What the captured output says, for comparison with the record's own fields."""

    head: str | None = None
    changed_paths: int | None = None
    packages: dict[str, str] | None = None
    python: str | None = None
    system_site_packages: bool | None = None
    gpu: GpuFacts | None = None


@dataclass
class InstallVerdict:
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    facts: InstallFacts = field(default_factory=InstallFacts)


class Unreadable(ValueError):
    """A captured file that is missing, not a regular file, too large, or not the output it should be."""


def judge_install(evidence: dict[str, Path], basis: InstallBasis) -> InstallVerdict:
    """Every install-phase check from the captured files (role -> path); never raises on bad content."""
    v = InstallVerdict()
    v.checks["clean_worktree"] = _worktree(evidence, basis, v.facts)
    v.checks["wheel_sha256_before_install"] = _wheel(evidence, basis)
    v.checks["install"] = _install(evidence, basis)
    v.checks["fresh_venv"] = _fresh(evidence, v.facts)
    inspect = _attempt(lambda: _inspect(evidence.get("pip_inspect")))
    closure: dict[str, str] | None = None
    missing: list[str] = []
    if isinstance(inspect, dict):
        closure, missing = installed_closure(inspect, "miniverl", basis.extras)
        v.facts.packages = closure
    v.checks["pip_check"] = _pip_check(evidence, closure, inspect)
    if closure is None:
        v.checks["stack_matches_known_good"] = (False, f"pip inspect: {inspect}")
    else:
        problems = stack_mismatches(basis.pins, closure) + [f"{m} is required but not installed" for m in missing]
        served, unserved = _served_from_index(evidence, basis)
        problems += unserved
        v.checks["stack_matches_known_good"] = (
            not problems,
            "; ".join(problems[:5])
            or f"pip inspect: the {len(closure)} packages of miniverl's closure are pinned"
            + (f"; pip's report: {', '.join(served[:5])}" if served else ""),
        )
    v.checks["python_version"] = _python(evidence, basis, inspect, v.facts)
    smi = _attempt(lambda: parse_nvidia_smi_csv(_text(evidence.get("nvidia_smi"), "nvidia-smi.csv")))
    v.facts.gpu = smi if isinstance(smi, GpuFacts) else None
    return v


def captured_gpu(evidence: dict[str, Path]) -> GpuFacts | None:
    """The GPU the captured ``nvidia-smi`` output names; None when absent or not nvidia-smi's CSV."""
    smi = _attempt(lambda: parse_nvidia_smi_csv(_text(evidence.get("nvidia_smi"), "nvidia-smi.csv")))
    return smi if isinstance(smi, GpuFacts) else None


# -- the checks ------------------------------------------------------------------------------------------------


def _worktree(evidence: dict[str, Path], basis: InstallBasis, facts: InstallFacts) -> tuple[bool, str]:
    try:
        head_lines = _lines(_text(evidence.get("git_head"), "git rev-parse HEAD"))
        if len(head_lines) != 1 or not COMMIT_HEX.match(head_lines[0]):
            raise Unreadable("git rev-parse HEAD did not print one 40-hex commit")
        status = _lines(_text(evidence.get("git_status"), "git status --porcelain", allow_empty=True))
        odd = [ln for ln in status if not _PORCELAIN.match(ln)]
        if odd:
            raise Unreadable(f"git status --porcelain printed a line that is not porcelain: {odd[0][:60]!r}")
    except Unreadable as exc:
        return False, str(exc)
    facts.head, facts.changed_paths = head_lines[0], len(status)
    return (
        head_lines[0] == basis.commit and not status,
        f"git: HEAD {head_lines[0][:12]} (candidate {basis.commit[:12]}), {len(status)} changed paths"
        + (f", first {status[0][:60]!r}" if status else ""),
    )


def _wheel(evidence: dict[str, Path], basis: InstallBasis) -> tuple[bool, str]:
    try:
        lines = _lines(_text(evidence.get("wheel_sha256"), "wheel-sha256.txt"))
        digest, _, name = lines[0].partition("  ") if len(lines) == 1 else ("", "", "")
        if not SHA256_HEX.match(digest) or not name:
            raise Unreadable("wheel-sha256.txt is not one `<sha256>  <file>` line")
        item = _report_item(evidence.get("pip_report"))
    except Unreadable as exc:
        return False, str(exc)
    info = _dict(_dict(item.get("download_info")).get("archive_info"))
    reported = _dict(info.get("hashes")).get("sha256")
    url = str(_dict(item.get("download_info")).get("url"))
    ok = (digest, name) == (basis.wheel_sha256, basis.wheel_filename) and reported == basis.wheel_sha256
    return ok, (
        f"before pip: {name[:80]} hashed {digest[:16]}; pip installed {url.rsplit('/', 1)[-1][:80]} with sha256 "
        f"{str(reported)[:16]}; the candidate's wheel {basis.wheel_filename} is {basis.wheel_sha256[:16]}"
    )


def _install(evidence: dict[str, Path], basis: InstallBasis) -> tuple[bool, str]:
    try:
        item = _report_item(evidence.get("pip_report"))
        inspect = _inspect(evidence.get("pip_inspect"))
    except Unreadable as exc:
        return False, str(exc)
    meta = _dict(item.get("metadata"))
    download = _dict(item.get("download_info"))
    installed = _find(inspect, "miniverl")
    direct = _dict(installed.get("direct_url")) if installed else {}
    editable = "dir_info" in download or "dir_info" in direct
    ok = (
        meta.get("version") == basis.version
        and item.get("is_direct") is True
        and "archive_info" in download
        and not editable
        and installed is not None
        and _dict(installed.get("metadata")).get("version") == basis.version
        and _dict(_dict(direct.get("archive_info")).get("hashes")).get("sha256") == basis.wheel_sha256
    )
    return ok, (
        f"pip's report: miniverl {str(meta.get('version'))[:20]} from an archive {('archive_info' in download)}, "
        f"editable {editable}; pip inspect: "
        + (
            f"miniverl {str(_dict(installed.get('metadata')).get('version'))[:20]} from a wheel with sha256 "
            f"{str(_dict(_dict(direct.get('archive_info')).get('hashes')).get('sha256'))[:16]}"
            if installed
            else "no miniverl installed"
        )
        + f" (candidate {basis.version}, {basis.wheel_sha256[:16]})"
    )


def _fresh(evidence: dict[str, Path], facts: InstallFacts) -> tuple[bool, str]:
    try:
        cfg = _pyvenv(_text(evidence.get("pyvenv_cfg"), "pyvenv.cfg"))
        before = _lines(_text(evidence.get("venv_before_install"), "pip freeze before the install"))
        parsed = [_FREEZE.match(ln) for ln in before]
        if not all(parsed):
            raise Unreadable("the pre-install `pip freeze --all --local` printed a line that is not name==version")
    except Unreadable as exc:
        return False, str(exc)
    facts.system_site_packages = cfg["include-system-site-packages"] == "true"
    seeded = sorted(normalize(m.group(1)) for m in parsed if m)
    extra = [n for n in seeded if n not in VENV_SEED]
    return not extra, (
        f"pyvenv.cfg: Python {cfg.get('version', cfg.get('version_info', '?'))[:20]}, system site-packages "
        f"{cfg['include-system-site-packages']}; before the install the venv held {seeded[:6]}"
        + (f", not only the seed {sorted(VENV_SEED)}" if extra else "")
    )


def _pip_check(evidence: dict[str, Path], closure: dict[str, str] | None, inspect: object) -> tuple[bool, str]:
    """Broken requirements within miniverl's closure fail; a venv over system site-packages also sees the machine's
    unrelated packages, whose problems are not the candidate's."""
    try:
        lines = _lines(_text(evidence.get("pip_check"), "pip check"))
    except Unreadable as exc:
        return False, str(exc)
    if lines == [PIP_CHECK_CLEAN]:
        return True, f"pip check: {PIP_CHECK_CLEAN}"
    odd = [ln for ln in lines if not _PIP_CHECK_LINE.match(ln)]
    if odd:
        return False, f"pip check printed a line that is not pip check's: {odd[0][:80]!r}"
    if closure is None:
        return False, f"pip check reports {len(lines)} problems; pip inspect cannot bound them: {inspect}"
    relevant = [ln for ln in lines if normalize(ln.split()[0]) in set(closure) | {"miniverl"}]
    if relevant:
        return False, "; ".join(relevant[:5])
    return True, f"no broken requirements in miniverl's closure ({len(lines)} outside it ignored)"


def _served_from_index(evidence: dict[str, Path], basis: InstallBasis) -> tuple[list[str], list[str]]:
    """(where pip says it fetched each local-version pin, the problems): a pin like ``torch==2.11.0+cu130`` that pip
    downloaded over http(s) must have come from the host of one of the known-good stack's extra index URLs. A
    package pip did not download (already in the machine's site-packages, or a carried wheel) shows no index."""
    local = {name: want for name, want in basis.pins.items() if "+" in want}
    if not local:
        return [], []
    try:
        items = _report(evidence.get("pip_report"))
    except Unreadable as exc:
        return [], [f"{', '.join(sorted(local))}: pip's report cannot show which index served them ({exc})"]
    origins = {_origin(url) for url in basis.index_urls}
    served, problems = [], []
    for item in items:
        name = _name(item)
        if name not in local:
            continue
        url = str(_dict(item.get("download_info")).get("url", ""))
        version = str(_dict(item.get("metadata")).get("version"))[:40]
        if not url.startswith(("http://", "https://")):
            served.append(f"{name} {version} from a local file")
        elif _origin(url) in origins:
            served.append(f"{name} {version} from {_origin(url)}")
        else:
            problems.append(
                f"{name} {version} came from {_origin(url)[:80]}, not from the known-good extra index "
                f"{', '.join(basis.index_urls) or '(none listed)'}"
            )
    return served, problems


def _origin(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{(parts.hostname or '').lower()}" + (f":{parts.port}" if parts.port else "")


def _python(evidence: dict[str, Path], basis: InstallBasis, inspect: object, facts: InstallFacts) -> tuple[bool, str]:
    try:
        version = _captured_python(evidence.get("python_version"))
        cfg = _pyvenv(_text(evidence.get("pyvenv_cfg"), "pyvenv.cfg"))
    except Unreadable as exc:
        return False, str(exc)
    facts.python = version
    venv_version = cfg.get("version") or cfg.get("version_info") or ""
    seen_by_pip = _dict(inspect.get("environment")).get("python_full_version") if isinstance(inspect, dict) else None
    pinned = python_matches(version, basis.python_pin)
    # pyvenv.cfg says "3.12.13" (version) or "3.12.13.final.0" (version_info): 3.12.1 must not pass for 3.12.13
    agree = (venv_version == version or venv_version.startswith(version + ".")) and seen_by_pip == version
    return pinned and agree, (
        f"the venv's sys.version {version}, pyvenv.cfg {venv_version[:20]}, pip inspect {str(seen_by_pip)[:20]}; "
        f"the known-good stack pins Python {basis.python_pin}"
    )


def python_matches(version: str, pin: str | None) -> bool:
    """``3.12.13`` against the descriptor's Python, to the precision it gives (``3.12`` or ``3.12.13``)."""
    return pin is None or version.split(".")[: len(pin.split("."))] == pin.split(".")


def require_python(captured: Path, pin: str | None) -> None:
    """Refuse, before pip installs anything, a venv whose captured ``sys.version`` is not the known-good Python."""
    from harness.core.errors import InstallError

    try:
        version = _captured_python(captured)
    except Unreadable as exc:
        raise InstallError(str(exc), check="python_version") from None
    if not python_matches(version, pin):
        raise InstallError(
            f"the venv's Python is {version}, the known-good stack pins Python {pin}; nothing was installed "
            "(pass --base-python with that interpreter)",
            check="python_version",
        )


# -- readers ---------------------------------------------------------------------------------------------------


def _captured_python(path: Path | None) -> str:
    first = _lines(_text(path, "sys.version"))[0]
    matched = _SYS_VERSION.match(first)
    if matched is None:
        raise Unreadable(f"python-version.txt is not sys.version: {first[:60]!r}")
    return matched.group(1)


def _attempt(fn: Any) -> Any:
    """``fn()``, or the reason it could not read its file (a str)."""
    try:
        return fn()
    except ValueError as exc:  # Unreadable, or nvidia-smi's CSV parser refusing the text
        return str(exc)


def _text(path: Path | None, what: str, *, allow_empty: bool = False) -> str:
    if path is None:
        raise Unreadable(f"the captured output of {what} is missing")
    try:
        info = path.lstat()
    except OSError:
        raise Unreadable(f"the captured output of {what} is missing") from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > CAPTURE_LIMIT_BYTES:
        raise Unreadable(f"the captured output of {what} is not a regular file within {CAPTURE_LIMIT_BYTES} bytes")
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        raise Unreadable(f"the captured output of {what} is not UTF-8 text") from None
    if not text.strip() and not allow_empty:
        raise Unreadable(f"the captured output of {what} is empty")
    return text


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines() if ln.strip()]


def _json(path: Path | None, what: str) -> dict[str, Any]:
    from harness.core.errors import RecordError
    from harness.core.jsonio import loads_strict

    text = _text(path, what)
    try:
        value = loads_strict(text.encode(), what)
    except (RecordError, ValueError, RecursionError):
        raise Unreadable(f"the captured output of {what} is not JSON") from None
    if not isinstance(value, dict):
        raise Unreadable(f"the captured output of {what} is not a JSON object")
    return value


def _inspect(path: Path | None) -> dict[str, Any]:
    doc = _json(path, "pip inspect")
    if doc.get("version") != "1" or not isinstance(doc.get("installed"), list) or "environment" not in doc:
        raise Unreadable("pip-inspect.json is not `pip inspect` output (version 1, installed, environment)")
    return doc


def _report(path: Path | None) -> list[dict[str, Any]]:
    """The ``install`` entries of pip's ``--report``."""
    doc = _json(path, "pip install --report")
    items = doc.get("install")
    if doc.get("version") != "1" or not isinstance(items, list):
        raise Unreadable("pip-install-report.json is not pip's installation report (version 1, install)")
    return [i for i in items if isinstance(i, dict)]


def _report_item(path: Path | None) -> dict[str, Any]:
    """pip's ``--report`` entry for miniverl (exactly one)."""
    ours = [i for i in _report(path) if _name(i) == "miniverl"]
    if len(ours) != 1:
        raise Unreadable(f"pip's installation report lists miniverl {len(ours)} times, not once")
    return ours[0]


def _pyvenv(text: str) -> dict[str, str]:
    cfg: dict[str, str] = {}
    for line in _lines(text):
        key, sep, value = line.partition("=")
        if not sep:
            raise Unreadable(f"pyvenv.cfg holds a line that is not `key = value`: {line[:60]!r}")
        cfg[key.strip()] = value.strip()
    if not {"home", "include-system-site-packages"} <= set(cfg) or not ({"version", "version_info"} & set(cfg)):
        raise Unreadable("pyvenv.cfg lacks home, include-system-site-packages or version")
    return cfg


def _name(item: dict[str, Any]) -> str:
    return normalize(str(_dict(item.get("metadata")).get("name", "")))


def _find(inspect: dict[str, Any], name: str) -> dict[str, Any] | None:
    found = [i for i in inspect["installed"] if isinstance(i, dict) and _name(i) == name]
    return found[0] if found else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# -- miniverl's installed closure from pip inspect's metadata -------------------------------------------------


def installed_closure(
    inspect: dict[str, Any], root: str, extras: tuple[str, ...] | list[str]
) -> tuple[dict[str, str], list[str]]:
    """(name -> version of every installed package ``root[extras]`` needs, the needed names not installed), the
    way harness.build.stacks' CLOSURE_SCRIPT walks importlib.metadata, here over ``pip inspect``'s metadata with
    its markers evaluated against the environment pip reported."""
    dists: dict[str, dict[str, Any]] = {}
    for item in inspect["installed"]:
        if isinstance(item, dict) and _name(item):
            dists.setdefault(_name(item), _dict(item.get("metadata")))
    env = {str(k): str(v) for k, v in _dict(inspect.get("environment")).items()}
    seen: dict[str, set[str]] = {}
    missing: set[str] = set()
    todo = [(normalize(root), {normalize(e) for e in extras})]
    while todo:
        name, want = todo.pop()
        meta = dists.get(name)
        if meta is None:
            missing.add(name)
            continue
        if name in seen and want <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | want
        requires = meta.get("requires_dist")
        for text in requires if isinstance(requires, list) else []:
            try:
                requirement = Requirement(str(text))
            except InvalidRequirement:
                continue
            marker = requirement.marker
            if marker is not None and not any(
                marker_holds(str(marker), {**env, "extra": e}) for e in (seen[name] or {""})
            ):
                continue
            todo.append((normalize(requirement.name), {normalize(x) for x in requirement.extras}))
    versions = {n: str(dists[n].get("version")) for n in sorted(seen) if n != normalize(root)}
    return versions, sorted(missing)


def marker_holds(marker: str, env: dict[str, str]) -> bool:
    """A PEP 508 environment marker, evaluated by ``packaging`` against ``env`` (an unparsable marker holds: its
    requirement is kept, so a package it names that is installed must be pinned)."""
    try:
        return Marker(marker).evaluate(env)
    except (InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
        return True
