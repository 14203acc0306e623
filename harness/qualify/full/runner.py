"""Run each implemented full workload on the installed candidate and turn its evidence into a record."""

from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness.core import policy, registry
from harness.core.errors import HarnessError
from harness.core.policy import CANDIDATE_BOUND as BOUND
from harness.core.proc import Redactor
from harness.core.recordio import record_bytes
from harness.core.records import InstalledFrom, Profile
from harness.qualify.binding import transcript_bound
from harness.qualify.checkbook import CheckBook
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.catalog import implemented
from harness.qualify.quiet import QuietGate
from harness.qualify.transcript import CliDriver

EVIDENCE_DIR = "evidence"


@dataclass
class Outcome:
    """A finished workload: its checks and figures, and the evidence files (archive member -> source)."""

    name: str
    book: CheckBook
    metrics: dict[str, int | float | bool | str | None]
    files: dict[str, tuple[str, Path]] = field(default_factory=dict)  # role -> (archive member, source file)


@dataclass(frozen=True)
class RunnerOptions:
    venv: Path
    root: Path  # each workload gets root/<name> as its fresh working directory
    redact: Redactor
    extra_env: dict[str, str]
    profile: Profile
    scale: Scale
    data_source: Path  # the smoke's sampled prompts
    model_wheel: Path | None
    verl_python: Path | None
    installed: InstalledFrom | None  # the origin proof's binding, stamped on every CLI invocation
    wheel_sha256: str  # the candidate manifest's wheel: every invocation's binding must name it
    verl_overlay: Path | None = None  # the candidate overlaid on verl's environment (harness.install.verl_env)
    verl_installed: InstalledFrom | None = None  # the overlay's binding, stamped on every `-m miniverl` there


def judge_into(book: CheckBook, workload: Workload, judgement: Judgement, profile: Profile) -> None:
    """Record the judged checks and those the judge found not applicable (a required one then fails the level);
    a required check the judge did not decide is recorded as skipped."""
    for name, (passed, detail) in judgement.checks.items():
        book.record(name, passed, detail)
    for name, reason in judgement.inapplicable.items():
        book.not_applicable_(name, reason)
    for name in registry.workload(workload.name).required_checks:
        if name not in book.required:
            book.not_applicable_(name, f"{profile.device} profile")
    book.skip_remaining(book.required, f"the {workload.name} judge did not decide it (its evidence is missing)")


def run_one(workload: Workload, opts: RunnerOptions, gate: QuietGate | None = None) -> Outcome:
    started = time.monotonic()
    work = opts.root / workload.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "data").mkdir(parents=True)
    shutil.copyfile(opts.data_source, work / "data" / "prompts.parquet")
    cli = CliDriver(
        venv=opts.venv,
        work=work,
        redact=opts.redact,
        installed=opts.installed,
        extra_env=dict(opts.extra_env),
        gate=gate,
        workload=workload.name,
    )
    ctx = Context(
        cli=cli,
        work=work,
        profile=opts.profile,
        scale=opts.scale,
        data="data/prompts.parquet",
        model_wheel=opts.model_wheel,
        verl_python=opts.verl_python,
        verl_overlay=opts.verl_overlay,
        verl_installed=opts.verl_installed,
    )
    evidence: dict[str, Path] = {}
    failure: str | None = None
    try:
        evidence = dict(workload.run(ctx))
    except HarnessError as exc:
        failure = opts.redact.text(str(exc))
    transcript = work / "transcript.json"
    transcript.write_bytes(record_bytes(cli.transcript()))
    evidence["transcript"] = transcript
    unknown = sorted(set(evidence) - set(workload.evidence))
    if unknown:
        raise HarnessError(f"workload {workload.name} returned evidence roles it does not declare: {unknown}")
    outcome = judged(workload, evidence, opts.profile, opts.scale, wheel_sha256=opts.wheel_sha256, failure=failure)
    outcome.metrics["scale"] = opts.scale.name
    outcome.metrics["wall_seconds"] = round(time.monotonic() - started, 3)
    return outcome


def judged(
    workload: Workload,
    evidence: dict[str, Path],
    profile: Profile,
    scale: Scale,
    *,
    wheel_sha256: str,
    failure: str | None = None,
) -> Outcome:
    """Judge ``evidence`` into an outcome whose checks are the policy's for ``workload`` on ``profile``; every CLI
    invocation of its transcript must have run the candidate wheel ``wheel_sha256`` (``candidate_bound``)."""
    book = CheckBook(policy.record_checks(profile, workload.name))
    judgement = workload.judge(evidence, profile, scale)
    book.record(BOUND, *transcript_bound(evidence.get("transcript"), wheel_sha256))
    if failure is not None:
        book.record("workload_run", False, failure)
    judge_into(book, workload, judgement, profile)
    files = {role: (workload.evidence[role], path) for role, path in sorted(evidence.items())}
    return Outcome(name=workload.name, book=book, metrics=dict(judgement.metrics), files=files)


def run_workloads(opts: RunnerOptions) -> tuple[list[Outcome], list[str]]:
    """Every registered full workload: the outcomes of those implemented (in registry order), the names missing.

    Where the scale says so, the workloads run side by side, each in its own thread driving its own CLI processes,
    with every timed step alone first (:class:`QuietGate`); elsewhere one after another."""
    todo: list[Workload] = []
    missing: list[str] = []
    for spec in registry.REGISTRY.workloads:
        if spec.name == "release-smoke":
            continue
        workload = implemented(spec.name)
        if workload is None:
            missing.append(spec.name)
        else:
            todo.append(workload)
    if not opts.scale.side_by_side:
        return [_announced(w, opts, None) for w in todo], missing
    # Each CLI process gets its share of the cores: torch's default of one thread a core, in every process at once,
    # would oversubscribe them many times over (busy-waiting OpenMP threads slow every process down).
    threads = str(max(1, (os.cpu_count() or 1) // max(1, len(todo))))
    opts = replace(opts, extra_env={"OMP_NUM_THREADS": threads, **opts.extra_env})
    gate = QuietGate((w.name, step) for w in todo for step in w.timed_steps)
    _progress(f"{len(todo)} workloads side by side; timed steps alone first: {sorted(s for _, s in gate.pending)}")
    with ThreadPoolExecutor(max_workers=len(todo) or 1, thread_name_prefix="workload") as pool:
        futures = [pool.submit(_announced, w, opts, gate) for w in todo]
        return [f.result() for f in futures], missing


def _announced(workload: Workload, opts: RunnerOptions, gate: QuietGate | None) -> Outcome:
    _progress(f"full workload {workload.name}")
    try:
        outcome = run_one(workload, opts, gate)
    finally:
        if gate is not None:
            gate.finished(workload.name)
    _progress(f"full workload {workload.name} done in {outcome.metrics['wall_seconds']} s")
    return outcome


def _progress(message: str) -> None:
    print(f"harness: {message}", file=sys.stderr, flush=True)
