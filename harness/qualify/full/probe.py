"""``python -m harness workload NAME``: run one full workload against an existing venv and print its judgement.

For developing and re-recording a workload (its evidence goes to ``--out``); a qualification never uses this:
``python -m harness full`` runs every workload on a freshly installed candidate.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from harness.core.errors import UsageError
from harness.core.jsonio import sha256_file
from harness.core.proc import Redactor
from harness.core.profiles import get_profile
from harness.install.origin import installed_from, origin_facts, probe_origin
from harness.install.venv import model_wheel
from harness.install.verl_env import prepare as prepare_verl
from harness.qualify.full.catalog import implemented
from harness.qualify.full.runner import RunnerOptions, run_one
from harness.qualify.full.scales import SCALES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="a registered full workload")
    p.add_argument("--profile", required=True)
    p.add_argument("--venv", required=True, help="a venv whose bin/miniverl runs the workload")
    p.add_argument("--data", required=True, help="a prompts parquet (e.g. `miniverl data sample --rows 8`)")
    p.add_argument("--work", required=True, help="scratch directory (new, empty, or one this command made)")
    p.add_argument("--out", required=True, help="new or empty directory for the evidence, laid out as archive members")
    p.add_argument("--model-cache", help="MINIVERL_CACHE for the CLI")
    p.add_argument("--offline-wheels")
    p.add_argument("--verl-python", help="python of verl 0.9.1's own environment (`make verl-env`)")
    p.add_argument("--wheel", help="with --verl-python: the candidate wheel overlaid on verl's environment")


SCRATCH_MARK = ".harness-workload-scratch"  # a --work directory holding it was made here and may be replaced


def _checked_inputs(args: argparse.Namespace) -> None:
    """Every input is checked before anything on disk changes."""
    miniverl = Path(args.venv) / "bin" / "miniverl"
    if not miniverl.is_file():
        raise UsageError(f"--venv {args.venv}: no bin/miniverl there (install the candidate into it first)")
    if not Path(args.data).is_file():
        raise UsageError(f"--data {args.data}: not a file (make one with `miniverl data sample --rows 8 --out F`)")
    if args.verl_python and not Path(args.verl_python).is_file():
        raise UsageError(
            f"--verl-python {args.verl_python}: not a file (e.g. .nox/verl_env/bin/python after make verl-env)"
        )
    if args.verl_python and not (args.wheel and Path(args.wheel).is_file()):
        raise UsageError("--verl-python needs --wheel WHEEL (the candidate overlaid on verl's environment)")
    if args.offline_wheels and not Path(args.offline_wheels).is_dir():
        raise UsageError(f"--offline-wheels {args.offline_wheels}: not a directory")
    work, out = Path(args.work), Path(args.out)
    if work.exists() and (not work.is_dir() or (any(work.iterdir()) and not (work / SCRATCH_MARK).is_file())):
        raise UsageError(f"--work {args.work}: exists and was not made by this command (it would be replaced)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {args.out}: exists and is not an empty directory (evidence is never overwritten)")


def probe(args: argparse.Namespace) -> int:
    workload = implemented(args.name)
    if workload is None:
        raise UsageError(f"no implemented full workload {args.name!r}", check="workload")
    profile = get_profile(args.profile)
    _checked_inputs(args)
    work, out = Path(args.work).absolute(), Path(args.out).absolute()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / SCRATCH_MARK).write_text("python -m harness workload scratch; replaced by the next run\n")
    venv = Path(args.venv).absolute()
    redact = Redactor({"work": work / args.name, "venv": venv})
    origin = origin_facts(probe_origin(venv, work, redact))
    verl_python = Path(args.verl_python).absolute() if args.verl_python else None
    verl = None
    if verl_python is not None:
        wheel = Path(args.wheel).absolute()
        version = wheel.name.split("-")[1] if wheel.name.count("-") >= 4 else ""
        verl = prepare_verl(verl_python, venv / "bin" / "python", wheel, sha256_file(wheel), version, work=work)
    opts = RunnerOptions(
        venv=venv,
        root=work,
        redact=redact,
        extra_env={"MINIVERL_CACHE": str(Path(args.model_cache).absolute())} if args.model_cache else {},
        profile=profile,
        scale=SCALES[profile.name],
        data_source=Path(args.data),
        model_wheel=model_wheel(Path(args.offline_wheels)) if args.offline_wheels else None,
        verl_python=verl_python,
        verl_overlay=verl.overlay if verl is not None else None,
        installed=installed_from(origin),
        verl_installed=verl.installed(str(origin.get("wheel_sha256"))) if verl is not None else None,
        # a development run binds to the wheel installed in --venv (it qualifies nothing)
        wheel_sha256=str(origin.get("wheel_sha256")),
    )
    outcome = run_one(workload, opts)
    for member, source in outcome.files.values():
        (out / member).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out / member)
    checks = outcome.book.checks()
    print(
        json.dumps(
            {
                "workload": args.name,
                "failures": checks.failures(),
                "checks": [c.model_dump() for c in checks.executed],
                "skipped": [c.model_dump() for c in checks.skipped],
                "not_applicable": [c.model_dump() for c in checks.not_applicable],
                "metrics": outcome.metrics,
            },
            indent=1,
        )
    )
    return 0 if not checks.failures() else 1
