"""Sessions by intent. The lead owns `tests`, `lint` and `runtime_smoke`; the harness owns the release sessions."""

from __future__ import annotations

from pathlib import Path

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
    """The whole test suite on CPU (GPU tests skip without CUDA), harness tests included."""
    install_project(session)
    session.install("-r", "harness/constraints-build.txt")
    session.run("python", "-m", "pytest", "-q", *session.posargs, env={"MINIVERL_CACHE": ".cache/miniverl"})


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff, mypy and the import-cycle check over the runtime and the harness."""
    install_project(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("python", "scripts/check_import_cycles.py", "miniverl", "harness")


@nox.session(python=PYTHON)
def runtime_smoke(session: nox.Session) -> None:
    """The runtime's own smoke on the embedded SmolLM2: OPD + GRPO cycles, export + PEFT reload."""
    install_project(session, extras="train")
    session.run("bash", "scripts/runtime_smoke.sh", *session.posargs, external=True)


KERNELS_TRITON = "triton==3.6.0"  # the H200 stack's triton (known-good/h200-cu130.txt)


@nox.session(python=PYTHON)
def kernels(session: nox.Session) -> None:
    """The decode step's and the training forward's triton kernels on CPU, under triton's interpreter, in a venv
    that has triton (the project with only what these tests import: torch, transformers for the tiny models, peft
    for the LoRA student, pytest)."""
    session.install("--constraint", CPU_STACK, "-e", ".", "torch", "transformers", "peft", "pytest", KERNELS_TRITON)
    session.run(
        "python", "-m", "pytest", "-q", "tests/unit/test_rollout_kernels.py", "tests/unit/test_rollout_gemm_kernels.py",
        "tests/unit/test_rollout_attention_kernel.py", "tests/unit/test_training_kernels.py", *session.posargs,
        env={"TRITON_INTERPRET": "1", "MINIVERL_CACHE": ".cache/miniverl"},
    )  # fmt: skip


DOCS_REQUIREMENTS = "requirements-docs.txt"


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site, built strictly (a broken link, a missing page or an API docstring griffe cannot read
    fails). mkdocstrings reads the API pages' modules from the checkout's source, so the project is not installed."""

    session.install("-r", DOCS_REQUIREMENTS)
    site = Path(session.create_tmp()) / "site"
    session.run(
        "mkdocs", "build", "--strict", "--site-dir", str(site), *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"}
    )


# --- release harness sessions (owned by the harness; torch-free venvs) -------------------------------
HARNESS = ("-r", "harness/requirements-audit.txt")
BUILD_TOOLCHAIN = ("-r", "harness/constraints-build.txt")
WORKFLOW_LINTERS = ("check-jsonschema==0.39.0", "zizmor==1.32.0")


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """The candidate: one wheel + one sdist from a git export of HEAD (`-- --check` re-validates out/candidate)."""
    session.install(*HARNESS, *BUILD_TOOLCHAIN)
    session.run("python", "-m", "harness", "build", *session.posargs)


def _option(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else default


def _qualify(session: nox.Session, command: str) -> None:
    import time

    args = session.posargs or ["--profile", "cpu-reference"]
    if command == "full" and "--verl-python" not in args:
        # The handoff diagnosis runs in verl 0.9.1's own venv (`nox -s verl_env`); the harness overlays the
        # candidate wheel's miniverl on it. Never dropped silently: without it, stop before any work.
        if not VERL_ENV_PYTHON.is_file():
            session.error(
                f"{VERL_ENV_PYTHON} is missing: run `make verl-env` (or `make full`, which builds it first), "
                "or pass `-- --verl-python PATH`"
            )
        args = [*args, "--verl-python", str(VERL_ENV_PYTHON.absolute())]
    session.install(*HARNESS, *BUILD_TOOLCHAIN)
    started = time.time()
    session.run("python", "-m", "harness", command, *args, success_codes=[0, 1])
    record = Path("out/qualification/qualification.json")
    if not record.is_file() or record.stat().st_mtime < started:
        session.error("no new out/qualification/qualification.json was written (see the harness error above)")
    level = "release_smoke" if command == "smoke" else "full_qualification"
    _audit(session, profile=_option(args, "--profile", "cpu-reference"), level=level, assets=False)


def _audit(session: nox.Session, *, profile: str, level: str, assets: bool, gate_record: str = "") -> None:
    """The torch-free auditor over out/. The commit, the known-good hash and the GPU come from this checkout
    and the profile (`python -m harness verify-checkout`), never from the files being verified."""
    args = ["--profile", profile, "--level", level] + (["--assets"] if assets else [])
    args += ["--gate-record", gate_record] if gate_record else []
    session.run("python", "-m", "harness", "verify-checkout", *args)


@nox.session(python=PYTHON)
def smoke(session: nox.Session) -> None:
    """Release smoke: candidate, fresh venv, origin proof, installed CLI, qualification.json, then the auditor."""
    _qualify(session, "smoke")


@nox.session(python=PYTHON)
def full(session: nox.Session) -> None:
    """Full qualification: the smoke plus every registered workload (fails closed while any is missing)."""
    _qualify(session, "full")


@nox.session(python=PYTHON)
def release_assets(session: nox.Session) -> None:
    """The canonical release-asset directory from out/candidate + out/qualification (`-- --profile P`)."""
    session.install(*HARNESS)
    args = session.posargs or ["--profile", "cpu-reference"]
    session.run("python", "-m", "harness", "release-assets", "--replace", *args)


@nox.session(python=PYTHON)
def verify(session: nox.Session) -> None:
    """The torch-free auditor over out/ (`-- --profile P --level L [--gate-record gate.json]`; release assets too
    when present, and a release gate's record compared with their statements when given)."""

    session.install(*HARNESS)
    args = session.posargs
    _audit(
        session,
        profile=_option(args, "--profile", "cpu-reference"),
        level=_option(args, "--level", "release_smoke"),
        assets=Path("out/release-assets").is_dir(),
        gate_record=_option(args, "--gate-record", ""),
    )


@nox.session(python=PYTHON)
def harness_tests(session: nox.Session) -> None:
    """The harness's own tests, in a venv without torch (the build toolchain, pydantic, PyYAML, pytest)."""
    session.install(*HARNESS, *BUILD_TOOLCHAIN, "pytest==9.2.0", "PyYAML==6.0.4")
    session.run("python", "-m", "pytest", "-q", "tests/harness", *session.posargs, env={"MINIVERL_HARNESS_TESTS": "1"})


@nox.session(python=PYTHON)
def schemas(session: nox.Session) -> None:
    """Regenerate manifests/harness (JSON Schemas, profiles, workload registry) from the pydantic models."""
    session.install(*HARNESS)
    session.run("python", "-m", "harness", "schemas", *session.posargs)


@nox.session(python=PYTHON)
def lint_workflows(session: nox.Session) -> None:
    """Offline workflow lint: the GitHub workflow JSON Schema and zizmor."""
    session.install(*WORKFLOW_LINTERS)
    workflows = sorted(str(p) for p in __import__("pathlib").Path(".github/workflows").glob("*.yml"))
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("zizmor", "--offline", ".github/workflows")


# --- verl 0.9.1 in its own venv (`verl_env`): the qualification's handoff diagnosis and the handoff tests ------
VERL_STACK = "known-good/verl-0.9.1-cpu.txt"
VERL_REQUIREMENTS = ("verl==0.9.1", "torch==2.13.0", "transformers<5.11", "pytest==9.2.0")
VERL_ENV_PYTHON = Path(".nox/verl_env/bin/python")


def _install_verl(session: nox.Session) -> None:
    """verl 0.9.1's pinned CPU stack (the lock), refusing any CUDA wheel before pip installs anything."""
    import json

    report = Path(session.create_tmp()) / "pip-dry-run.json"
    install = ("--constraint", VERL_STACK, *VERL_REQUIREMENTS)
    session.run("python", "-m", "pip", "install", "--quiet", "--dry-run", "--report", str(report), *install)
    planned = json.loads(report.read_text())["install"]
    cuda = [f"{p['metadata']['name']}=={p['metadata']['version']}" for p in planned if _is_cuda(p)]
    if cuda:
        session.error(f"refusing to install CUDA wheels into the CPU verl venv: {', '.join(cuda)}")
    session.install(*install)
    # verl 0.9.1's wheel installs a top-level `tests` package that shadows this repository's tests/;
    # verl never imports it at run time, so the session venv drops it.
    session.run("python", "-c", _DROP_VERL_TESTS)


@nox.session(python=PYTHON)
def verl_env(session: nox.Session) -> None:
    """verl 0.9.1's own venv for `full` and `verl` (`.nox/verl_env`): the lock only, no miniverl. The harness overlays
    the candidate wheel's miniverl on it (`--target` + PYTHONPATH), so the diagnosis runs the bytes being qualified;
    `verl` puts the checkout there the same way."""
    _install_verl(session)
    session.run(
        "python",
        "-c",
        "import verl; assert verl.__version__ == '0.9.1', verl.__version__; print('verl', verl.__version__)",
    )


@nox.session(python=False)
def verl(session: nox.Session) -> None:
    """verl 0.9.1 on CPU (no vLLM, no Ray cluster): diagnose bundles compiled from the examples, assert `ready`;
    and miniverl's PPO update sequence (2 epochs x 2 mini-batches) against verl's core_algos on fixed inputs.

    The bundles include the direct-config (compiler v4) one of examples/verl-native-grpo.yaml and the PPO
    (compiler v2) ones of examples/ppo-verl-smollm2.yaml and of a tiny PPO run (actor and critic adapters).
    They run in `verl_env`'s interpreter (`make verl` builds it first) with this checkout first on PYTHONPATH: the
    venv keeps verl's lock only, as `full` needs it, and one verl install serves both.
    """
    if not VERL_ENV_PYTHON.is_file():
        session.error(f"{VERL_ENV_PYTHON} is missing: run `make verl` (it builds verl_env first) or `nox -s verl_env`")
    session.run(
        str(VERL_ENV_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_handoff_verl.py",
        "tests/integration/test_ppo_against_verl.py", *session.posargs,
        env={"OMP_NUM_THREADS": "1", "MINIVERL_CACHE": ".cache/miniverl", "PYTHONPATH": str(Path.cwd())},
        external=True,
    )  # fmt: skip


def _is_cuda(package: dict) -> bool:
    name = package["metadata"]["name"].lower()
    version = package["metadata"]["version"]
    return name.startswith(("nvidia-", "cuda-", "triton")) or (name == "torch" and not version.endswith("+cpu"))


_DROP_VERL_TESTS = """
import pathlib, shutil, sysconfig
root = pathlib.Path(sysconfig.get_paths()["purelib"])
record = next(root.glob("verl-0.9.1.dist-info/RECORD")).read_text()
if "tests/__init__.py" in record and (root / "tests").is_dir():
    shutil.rmtree(root / "tests")
    print("removed verl's top-level tests package from", root.name)
"""
