"""Sessions by intent. The lead owns `tests`, `lint` and `runtime_smoke`; the harness owns the release sessions."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests"]

PYTHON = "3.11"
CPU_STACK = "known-good/cpu-reference.txt"


def install_project(session: nox.Session, extras: str = "train,cuda,dev") -> None:
    session.install("--constraint", CPU_STACK, "-e", f".[{extras}]")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite on CPU (GPU tests skip without CUDA)."""
    install_project(session)
    session.run("python", "-m", "pytest", "-q", *session.posargs, env={"MINIVERL_CACHE": ".cache/miniverl"})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff and mypy over the runtime and the harness."""
    install_project(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session(python=PYTHON)
def runtime_smoke(session: nox.Session) -> None:
    """The runtime's own smoke on the embedded SmolLM2: OPD + GRPO cycles, export + PEFT reload."""
    install_project(session, extras="train")
    session.run("bash", "scripts/runtime_smoke.sh", *session.posargs, external=True)
