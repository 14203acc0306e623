"""verl 0.9.1's own environment, with the candidate's miniverl laid over it.

The handoff diagnosis runs ``<verl-python> -m miniverl diagnose`` in verl's environment (verl pins its own
transformers, so it never shares the qualification venv). Whatever that environment holds for miniverl (an
editable checkout, another wheel, nothing), the harness installs the candidate wheel with ``pip --target`` into
an overlay directory and runs every such invocation with ``PYTHONPATH=<overlay>``: PYTHONPATH precedes
site-packages and every ``.pth`` entry, so the candidate's bytes are the miniverl verl's interpreter imports.
:func:`prove` checks that before any workload runs; :func:`require_verl` refuses a missing or wrong verl before
the harness does any work at all.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import HarnessError, InstallError, UsageError
from harness.core.jsonio import sha256_file
from harness.core.proc import Redactor, clean_env, last_line, run
from harness.core.records import InstalledFrom

VERL_VERSION = "0.9.1"
OVERLAY_LABEL = "verl-overlay"  # how the overlay directory is named in evidence (never a local path)
PROBE_TIMEOUT_S = 300  # importing verl imports torch and transformers: seconds on a warm disk, more on a cold one
MISSING = (
    "the full qualification needs verl 0.9.1's own environment for the handoff diagnosis: run `make verl-env` "
    "(builds .nox/verl_env; `make full` does it first), or pass --verl-python PATH"
)

# Printed as the last stdout line. `import verl` may print to stdout first (warnings, banners).
PROBE = r"""
import json, sys
facts = {"python_version": sys.version.split()[0]}
def attempt(name):
    try:
        module = __import__(name)
    except Exception as exc:
        facts[name + "_error"] = (type(exc).__name__ + ": " + str(exc))[:300]
        return None
    return module
if "miniverl" in sys.argv[1:]:
    miniverl = attempt("miniverl")
    if miniverl is not None:
        facts["miniverl_version"] = str(getattr(miniverl, "__version__", None))
        facts["miniverl_file"] = str(getattr(miniverl, "__file__", None))
verl = attempt("verl")
if verl is not None:
    facts["verl_version"] = str(getattr(verl, "__version__", None))
sys.stdout.flush()
print("\n" + json.dumps(facts, sort_keys=True))
"""


def child_env(overlay: Path | None) -> dict[str, str]:
    """The variables verl's interpreter runs with: the overlay first on PYTHONPATH, and PYTHONSAFEPATH so that
    the working directory (``-m`` would put it first on sys.path) can never shadow the overlay."""
    env = {"PYTHONSAFEPATH": "1"}
    if overlay is not None:
        env["PYTHONPATH"] = str(overlay)
    return env


def probe(python: Path, *, cwd: Path, overlay: Path | None, miniverl: bool) -> dict[str, str]:
    """What ``python`` imports (under :func:`child_env`): verl's version and, if asked, miniverl's version and
    file. A probe that could not run at all raises ``HarnessError`` (``verl_environment``)."""
    argv: list[str | Path] = [python, "-c", PROBE, *(["miniverl"] if miniverl else [])]
    try:
        done = run(argv, cwd=cwd, env=clean_env(child_env(overlay)), timeout=PROBE_TIMEOUT_S)
    except OSError as exc:
        raise HarnessError(f"cannot execute {python}: {exc.strerror}", check="verl_environment") from None
    except subprocess.TimeoutExpired:
        raise HarnessError(f"{python} did not answer in {PROBE_TIMEOUT_S} s", check="verl_environment") from None
    lines = [ln for ln in done.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
    try:
        facts = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        facts = None
    if not isinstance(facts, dict) or not all(isinstance(v, str) for v in facts.values()):
        why = last_line(done.stderr) or f"exit {done.returncode}, no probe output"
        raise HarnessError(f"{python} could not run the environment probe: {why}", check="verl_environment")
    return facts


def require_verl(python: Path | None) -> str:
    """The full level's pre-flight, before any work: ``python``'s own environment imports verl 0.9.1.
    Returns the version; anything else is one ``[verl_python]`` usage line."""
    if python is None:
        raise UsageError(MISSING, check="verl_python")
    if not python.is_file():
        raise UsageError(f"--verl-python {python} is not a file; {MISSING}", check="verl_python")
    with tempfile.TemporaryDirectory(prefix="miniverl-verl-probe-") as tmp:
        try:
            facts = probe(python, cwd=Path(tmp), overlay=None, miniverl=False)
        except HarnessError as exc:
            raise UsageError(f"{exc}; {MISSING}", check="verl_python") from None
    version = facts.get("verl_version")
    if version != VERL_VERSION:
        found = f"verl {version}" if version else facts.get("verl_error", "no verl")
        raise UsageError(f"--verl-python {python}: {found}, not verl {VERL_VERSION}; {MISSING}", check="verl_python")
    return version


@dataclass(frozen=True)
class VerlEnv:
    """verl's interpreter with the candidate overlaid, as :func:`prove` observed it."""

    python: Path
    overlay: Path
    verl_version: str
    miniverl_version: str
    miniverl_file: str  # relative to the overlay, e.g. ``miniverl/__init__.py``

    def installed(self, wheel_sha256: str) -> InstalledFrom:
        """The binding every ``-m miniverl`` invocation under verl's interpreter carries: the overlay was installed
        from the wheel whose sha256 the harness checked (``wheel_sha256``), and imports from the overlay. The
        executable is the interpreter each invocation names (``run_module`` fills it in)."""
        return InstalledFrom(
            wheel_sha256=wheel_sha256, import_origin=self.facts()["miniverl_file"], executable="<verl-python>"
        )

    def facts(self) -> dict[str, str]:
        """For evidence: no local path, the overlay named ``<verl-overlay>``."""
        return {
            "verl_version": self.verl_version,
            "miniverl_version": self.miniverl_version,
            "miniverl_file": f"<{OVERLAY_LABEL}>/{self.miniverl_file}",
        }


def install_overlay(installer: Path, wheel: Path, wheel_sha256: str, overlay: Path, *, cwd: Path) -> None:
    """``pip install --no-deps --no-index --target OVERLAY WHEEL`` with ``installer`` (the qualification venv's
    python): only the candidate's own files, no network, nothing compiled for another interpreter."""
    if wheel.is_symlink() or sha256_file(wheel) != wheel_sha256:
        raise InstallError(f"{wheel.name}: sha256 differs from the candidate manifest", check="verl_environment")
    if overlay.is_symlink():
        overlay.unlink()
    elif overlay.exists():
        shutil.rmtree(overlay)
    argv: list[str | Path] = [
        installer, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--no-cache-dir",
        "--no-input", "--disable-pip-version-check", "--target", overlay, wheel,
    ]  # fmt: skip
    done = run(argv, cwd=cwd, env=clean_env({"PIP_NO_INPUT": "1"}), timeout=600)
    if done.returncode != 0 or not (overlay / "miniverl").is_dir():
        why = Redactor({OVERLAY_LABEL: overlay}).text(last_line(done.stderr) or "no miniverl/ in the overlay")
        raise InstallError(f"pip install --target of the candidate failed: {why}", check="verl_environment")


def prove(python: Path, overlay: Path, version: str, *, cwd: Path) -> VerlEnv:
    """verl's interpreter, with the overlay, imports verl 0.9.1 and the candidate's miniverl from the overlay."""
    facts = probe(python, cwd=cwd, overlay=overlay, miniverl=True)
    redact = Redactor({OVERLAY_LABEL: overlay})
    verl, mv_version, mv_file = facts.get("verl_version"), facts.get("miniverl_version"), facts.get("miniverl_file")
    if verl != VERL_VERSION:
        found = f"verl {verl}" if verl else facts.get("verl_error", "no verl")
        raise HarnessError(f"verl's environment imports {found}, not {VERL_VERSION}", check="verl_environment")
    if mv_file is None or mv_version is None:
        why = redact.text(facts.get("miniverl_error", "no miniverl"))
        raise HarnessError(f"verl's environment cannot import the candidate: {why}", check="verl_environment")
    file, root = Path(mv_file).resolve(), overlay.resolve()
    if not file.is_relative_to(root):
        raise HarnessError(
            f"verl's environment imports miniverl from {redact.text(mv_file)}, not from the candidate overlay "
            "(a --verl-python wrapper must keep the PYTHONPATH it is given in front of its own entries)",
            check="verl_environment",
        )
    if mv_version != version:
        raise HarnessError(
            f"verl's environment imports miniverl {mv_version}, the candidate is {version}", check="verl_environment"
        )
    return VerlEnv(
        python=python,
        overlay=overlay,
        verl_version=verl,
        miniverl_version=mv_version,
        miniverl_file=file.relative_to(root).as_posix(),
    )


def prepare(python: Path, installer: Path, wheel: Path, wheel_sha256: str, version: str, *, work: Path) -> VerlEnv:
    """The overlay at ``work/verl-overlay`` from the candidate wheel, then :func:`prove`."""
    overlay = work / OVERLAY_LABEL
    install_overlay(installer, wheel, wheel_sha256, overlay, cwd=work)
    probe_cwd = work / "verl-probe"
    probe_cwd.mkdir(exist_ok=True)
    return prove(python, overlay, version, cwd=probe_cwd)


def observed(python: Path, overlay: Path | None, *, cwd: Path) -> dict[str, str | None]:
    """What verl's interpreter imports right now, for a workload's evidence (no local path; never raises): the
    judge compares it with the candidate, the harness already refused a mismatch before any workload ran."""
    labels = Redactor({OVERLAY_LABEL: overlay} if overlay is not None else {})
    facts: dict[str, str | None] = {
        "verl_overlay": f"<{OVERLAY_LABEL}>" if overlay is not None else None,
        "verl_version": None,
        "miniverl_version": None,
        "miniverl_file": None,
    }
    try:
        seen = probe(python, cwd=cwd, overlay=overlay, miniverl=True)
    except HarnessError as exc:
        return {**facts, "probe_error": labels.text(str(exc))}
    for key in ("verl_version", "miniverl_version"):
        facts[key] = seen.get(key)
    file = seen.get("miniverl_file")
    if file is not None:
        resolved = Path(file).resolve()
        inside = overlay is not None and resolved.is_relative_to(overlay.resolve())
        facts["miniverl_file"] = (
            f"<{OVERLAY_LABEL}>/{resolved.relative_to(overlay.resolve()).as_posix()}"
            if inside and overlay is not None
            else labels.text(file)
        )
    errors = "; ".join(seen[k] for k in ("miniverl_error", "verl_error") if k in seen)
    if errors:
        facts["probe_error"] = labels.text(errors)
    return facts
