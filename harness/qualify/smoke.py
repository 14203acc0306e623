"""Release smoke / full qualification: candidate -> fresh venv -> origin proof -> installed CLI -> record."""

from __future__ import annotations

import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness.build.candidate import MANIFEST, build_candidate, check_candidate, read_pins, workflow_binding
from harness.build.stacks import (
    descriptor_paths,
    gpu_facts,
    installed_closure,
    load_known_good,
    nvidia_smi,
    stack_mismatches,
)
from harness.core import registry
from harness.core.errors import HarnessError, UsageError
from harness.core.jsonio import canonical_bytes, sha256_file
from harness.core.proc import Redactor, clean_env, run, utc_now
from harness.core.profiles import profile_sha256
from harness.core.recordio import record_bytes
from harness.core.records import CandidateManifest, Worktree
from harness.install.origin import installed_from, origin_facts, probe_origin
from harness.install.venv import (
    CapturedInstall,
    InstallOptions,
    fresh_venv,
    install_candidate,
    interpreter_version,
    model_wheel,
    pip_output,
    venv_python,
)
from harness.install.verl_env import prepare as prepare_verl
from harness.install.verl_env import require_verl
from harness.install.vllm_site import python_path
from harness.qualify.checkbook import CheckBook
from harness.qualify.full.runner import Outcome, RunnerOptions, run_workloads
from harness.qualify.full.scales import SCALES
from harness.qualify.install_judge import INSTALL_FILES, InstallBasis, judge_install, require_python
from harness.qualify.options import SmokeOptions
from harness.qualify.qualification import QualificationInputs, write_qualification
from harness.qualify.smoke_judge import SmokeBasis, SmokeVerdict, judge_smoke
from harness.qualify.steps import StepFacts, run_cli_steps
from harness.qualify.transcript import CliDriver


@dataclass(frozen=True)
class GitOutput:
    """What ``git rev-parse HEAD`` and ``git status --porcelain`` printed in the checkout (None: git failed)."""

    head: str | None
    status: str | None


def git_output(repo: Path) -> GitOutput:
    def out(*args: str) -> str | None:
        try:
            done = run(["git", "-C", repo, *args], env=clean_env({"GIT_TERMINAL_PROMPT": "0"}))
        except FileNotFoundError:
            return None
        return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None

    return GitOutput(head=out("rev-parse", "HEAD"), status=out("status", "--porcelain"))


def worktree(repo: Path, commit: str, captured: GitOutput | None = None) -> Worktree:
    """Clean only if the checkout running the harness is at the candidate's commit with no changes."""
    got = captured or git_output(repo)
    if got.head is None or got.status is None:
        return Worktree(state="unknown", commit=None, changed_paths=0)
    head = got.head.strip()
    changed = len([ln for ln in got.status.splitlines() if ln.strip()])
    return Worktree(state="clean" if changed == 0 and head == commit else "dirty", commit=head, changed_paths=changed)


def run_smoke(opts: SmokeOptions) -> int:
    """Run the qualification; always writes ``qualification.json`` (passed or failed). Returns the exit code."""
    started, t0 = utc_now(), time.monotonic()
    profile = opts.profile
    if opts.level == "full_qualification":
        require_verl(opts.verl_python)  # before anything is built, installed or written
    binding = workflow_binding()
    if opts.out.resolve().is_relative_to(opts.repo.resolve()) and not opts.out.resolve().is_relative_to(
        (opts.repo / "out").resolve()
    ):
        raise UsageError("--out inside the checkout must lie under out/ (ignored by git)", check="output")
    candidate_dir = opts.candidate or (opts.repo / "out" / "candidate")
    if opts.candidate is None:
        _progress(f"building the candidate from HEAD into {candidate_dir.name}/")
        build_candidate(opts.repo, candidate_dir)
    manifest = check_candidate(candidate_dir)  # refused before anything is installed
    book = CheckBook(registry.required_smoke_checks(profile.device, grpo=opts.grpo))
    book.record("candidate_validated", True, "exact file set, regular files, SHA256SUMS, hashes, manifest schema")
    descriptor, kg_sha = load_known_good(profile, opts.known_good_dir)
    book.record("known_good_integrity", True, f"{descriptor.name} ({descriptor.status}) matches its constraints file")
    git_said = git_output(opts.repo)
    tree = worktree(opts.repo, manifest.source_commit, git_said)

    work = opts.work or Path(tempfile.mkdtemp(prefix="miniverl-qual-"))
    work.mkdir(parents=True, exist_ok=True)
    if work.resolve().is_relative_to(opts.repo.resolve()):
        raise UsageError("the work directory must lie outside the checkout", check="cleanup_target")
    redact = Redactor(
        {
            "venv": work / "venv",
            "work": work / "cli",
            "scratch": work,
            "checkout": opts.repo,
            "candidate": candidate_dir,
            "out": opts.out,
            "known-good": opts.known_good_dir,
            **({"wheels": opts.offline_wheels} if opts.offline_wheels else {}),
        }
    )
    txt, _ = descriptor_paths(profile.known_good, opts.known_good_dir)
    install = InstallOptions(
        base_python=opts.base_python,
        constraint=txt,
        extras=profile.install_extras,
        system_site_packages=opts.system_site_packages,
        offline_wheels=opts.offline_wheels,
        extra_index_urls=tuple(descriptor.extra_index_urls),
    )
    facts = StepFacts()
    packages: dict[str, str] = {}
    mismatches: list[str] = ["not measured"]
    install_argv: list[str] = []
    origin_facts_: dict[str, str | int | bool | None] = {}
    python_version = platform.python_version()
    smi_said = nvidia_smi()
    smi = gpu_facts(smi_said or "")
    env = {"MINIVERL_CACHE": str(opts.model_cache)} if opts.model_cache else {}
    captured = work / "install"
    captured.mkdir(exist_ok=True)

    def keep(role: str, text: str | None) -> None:
        """The raw output of one install-phase command, redacted of local paths, as evidence (None: not run)."""
        if text is not None:
            path = captured / INSTALL_FILES[role]
            path.write_text(redact.text(text), encoding="utf-8")
            facts.evidence[role] = path

    keep("git_head", git_said.head)
    keep("git_status", git_said.status)
    keep("nvidia_smi", smi_said)
    install_basis = InstallBasis(
        commit=manifest.source_commit,
        version=manifest.version,
        wheel_filename=manifest.wheel.filename,
        wheel_sha256=manifest.wheel.sha256,
        extras=tuple(profile.install_extras),
        pins=read_pins(txt),
        python_pin=descriptor.python,
        index_urls=tuple(descriptor.extra_index_urls),
    )
    try:
        venv = work / "venv"
        _progress("creating a fresh venv")
        python = fresh_venv(venv, install, work=work)
        keep("pyvenv_cfg", (venv / "pyvenv.cfg").read_text(encoding="utf-8"))
        keep("venv_before_install", pip_output(python, work, "freeze", "--all", "--local"))
        keep("python_version", interpreter_version(python, work))
        require_python(facts.evidence["python_version"], descriptor.python)  # before pip installs anything
        _progress("installing the candidate wheel")
        install_argv = install_candidate(
            python,
            candidate_dir / manifest.wheel.filename,
            manifest.wheel.sha256,
            install,
            work=work,
            redact=redact,
            captured=CapturedInstall(
                wheel_sha256=captured / INSTALL_FILES["wheel_sha256"], pip_report=work / "pip-report.json"
            ),
        )
        facts.evidence["wheel_sha256"] = captured / INSTALL_FILES["wheel_sha256"]
        keep("pip_report", without_descriptions((work / "pip-report.json").read_text(encoding="utf-8"), "install"))
        keep("pip_inspect", without_descriptions(pip_output(python, work, "inspect"), "installed"))
        keep("pip_check", pip_output(python, work, "check"))
        packages, missing, python_version = installed_closure(python, profile.install_extras, work)
        mismatches = stack_mismatches(read_pins(txt), packages) + [
            f"{m} is required but not installed" for m in missing
        ]
        origin_cwd = work / "origin"
        origin_cwd.mkdir()
        origin = probe_origin(venv, origin_cwd, redact)
        origin_facts_ = origin_facts(origin)
        (origin_cwd / "origin.json").write_bytes(canonical_bytes(origin) + b"\n")
        facts.evidence["origin"] = origin_cwd / "origin.json"
        cli_dir = work / "cli"
        cli_dir.mkdir()
        cli = CliDriver(venv=venv, work=cli_dir, redact=redact, installed=installed_from(origin_facts_), extra_env=env)
        _progress("driving the installed CLI")
        try:
            run_cli_steps(cli, profile, model_wheel(opts.offline_wheels), facts, grpo=opts.grpo)
        finally:
            (cli_dir / "transcript.json").write_bytes(record_bytes(cli.transcript()))
            facts.evidence["transcript"] = cli_dir / "transcript.json"
    except HarnessError as exc:
        book.record(
            exc.check
            if exc.check in registry.SMOKE_CHECKS and exc.check not in {c.name for c in book.executed}
            else "smoke_step",
            False,
            redact.text(str(exc)),
        )
    judged = judge_install(facts.evidence, install_basis)
    for name in ("clean_worktree", *(n for n in judged.checks if n != "clean_worktree")):
        if name == "clean_worktree" or "pip_check" in facts.evidence:  # else the install failed before pip check
            _record_verdict(book, SmokeVerdict(checks={name: judged.checks[name]}))
    verdict = SmokeVerdict()
    if "origin" in facts.evidence:
        verdict = judge_smoke(
            facts.evidence, SmokeBasis(profile, manifest.version, manifest.wheel.sha256, smi.name if smi else None)
        )
        _record_verdict(book, verdict)
        if not opts.grpo:
            book.skip("grpo_plan", "--skip-grpo: the GRPO cycle was not run (not required)")
            book.skip("grpo_cycle", "--skip-grpo: the GRPO cycle was not run (not required)")
    book.skip_remaining([c for c in book.required if c not in registry.EVIDENCE_CHECKS], "an earlier step failed")
    outcomes: list[Outcome] = []
    absent: list[str] = []
    not_run: str | None = None
    if opts.level == "full_qualification":
        smoke_failures = book.failures_so_far()
        if smoke_failures or "input_prompts" not in facts.evidence:
            not_run = "the release smoke failed first: " + (smoke_failures[:1] or ["no sampled prompts"])[0][:200]
        else:
            outcomes, absent, not_run = _full_workloads(
                opts, work, candidate_dir / manifest.wheel.filename, manifest, facts, redact, env, origin_facts_
            )
    inputs = QualificationInputs(
        opts=opts,
        manifest=manifest,
        manifest_sha256=sha256_file(candidate_dir / MANIFEST),
        profile_sha256=profile_sha256(profile),
        descriptor=descriptor,
        known_good_sha256=kg_sha,
        book=book,
        facts=facts,
        metrics=dict(verdict.metrics),
        packages=packages,
        mismatches=mismatches,
        python_version=python_version,
        smi=smi,
        binding=binding,
        tree=tree,
        install_argv=install_argv,
        origin=origin_facts_,
        started=started,
        wall=time.monotonic() - t0,
        outcomes=tuple(outcomes),
        missing=tuple(absent),
        not_run=not_run,
    )
    status = write_qualification(inputs)
    if not opts.keep_work and opts.work is None:
        shutil.rmtree(work, ignore_errors=True)
    _progress(f"qualification {status}: {opts.out.name}/qualification.json")
    return 0 if status == "passed" else 1


def _record_verdict(book: CheckBook, verdict: SmokeVerdict) -> None:
    """The judge's decisions into the book (a check the install step already failed keeps that failure)."""
    seen = {c.name for c in book.executed}
    for name, (passed, detail) in verdict.checks.items():
        if name not in seen:
            book.record(name, passed, detail)
    for name, reason in verdict.not_applicable.items():
        book.not_applicable_(name, reason)


def _full_workloads(
    opts: SmokeOptions,
    work: Path,
    wheel: Path,
    manifest: CandidateManifest,
    facts: StepFacts,
    redact: Redactor,
    env: dict[str, str],
    origin: dict[str, str | int | bool | None],
) -> tuple[list[Outcome], list[str], str | None]:
    """The candidate overlaid on verl's environment and proven there, then every workload; (outcomes, missing,
    why none ran). An overlay that cannot be proven runs no workload: each is recorded as failed, not run."""
    assert opts.verl_python is not None  # require_verl refused its absence before any work
    if opts.vllm_site is not None:
        try:
            path = python_path(venv_python(work / "venv"), opts.vllm_site.path, work=work)
        except HarnessError as exc:
            return [], [], "the vLLM site could not be put on the CLI's path: " + redact.text(exc.line())[:300]
        env = {**env, "PYTHONPATH": path}
        _progress(f"vLLM site {opts.vllm_site.sha256[:12]} ({opts.vllm_site.files} files) after the venv's site")
    _progress("overlaying the candidate on verl's environment")
    try:
        verl = prepare_verl(
            opts.verl_python,
            venv_python(work / "venv"),
            wheel,
            manifest.wheel.sha256,
            manifest.version,
            work=work,
        )
    except HarnessError as exc:
        return [], [], "the candidate could not be overlaid on verl's environment: " + redact.text(exc.line())[:300]
    _progress(f"verl {verl.verl_version} imports miniverl {verl.miniverl_version} from {verl.facts()['miniverl_file']}")
    outcomes, absent = run_workloads(
        RunnerOptions(
            venv=work / "venv",
            root=work / "full",
            redact=redact,
            extra_env=env,
            profile=opts.profile,
            scale=SCALES[opts.profile.name],
            data_source=facts.evidence["input_prompts"],
            model_wheel=model_wheel(opts.offline_wheels),
            verl_python=opts.verl_python,
            verl_overlay=verl.overlay,
            installed=installed_from(origin),
            verl_installed=verl.installed(manifest.wheel.sha256),
            wheel_sha256=manifest.wheel.sha256,
        )
    )
    return outcomes, absent, None


def without_descriptions(report: str, key: str) -> str:
    """pip's JSON (``inspect``: ``installed``, ``install --report``: ``install``) without each package's long
    ``description`` (its README: megabytes over a machine's site-packages, of text that judges nothing and may quote
    paths such as ``~/.cache``, which evidence_portable refuses); all else as printed."""
    import json

    try:
        doc = json.loads(report)
        for item in doc.get(key, []):
            item.get("metadata", {}).pop("description", None)
    except (ValueError, AttributeError, TypeError):
        return report  # not pip's JSON: kept as printed, and the judge refuses it
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _progress(message: str) -> None:
    print(f"harness: {message}", file=sys.stderr, flush=True)
