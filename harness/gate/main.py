"""``python -m harness release-gate``: query, choose, download, verify; always write ``gate.json``.

Exit 0 when every check passes (and, without ``--dry-run``, the release is authorized); 1 with one stderr
line ``[check] why`` on any failed check (``[deadline]`` when the whole gate runs out of time,
``[download_deadline]`` when one download does); 2 on usage errors. ``GITHUB_TOKEN`` is never printed or written.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import ValidationError

from harness.core.errors import HarnessError, UsageError
from harness.core.gate_records import (
    ArtifactRef,
    ChosenRun,
    GateCheck,
    GateQuery,
    GateRecord,
    OtherRun,
    is_api_path,
    is_repository,
)
from harness.core.jsonio import looks_like_local_path, sha256_file
from harness.core.policy import profile_for_gpu
from harness.core.profiles import PROFILES
from harness.core.recordio import write_record
from harness.core.records import FileDigest
from harness.gate import GateError
from harness.gate.http import Deadline, GitHubClient, origin, origin_text
from harness.gate.runs import LEVEL_ARTIFACTS, NoRunError, Target, select_run
from harness.gate.safezip import ZipLimits
from harness.gate.verify import check_digest, download, extract, known_good_sha256, unpack, write_outputs

GATE_JSON = "gate.json"
DEFAULT_GPU = PROFILES["rtx4080-wsl2-cu130"].required_gpu_name
_SHA = re.compile(r"[0-9a-f]{40}")
_WORKFLOW = re.compile(r"[A-Za-z0-9_.-]+\.ya?ml")
_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
DEADLINE_SECONDS = 600.0
DOWNLOAD_SECONDS = 300.0
MAX_SECONDS = 86_400.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--api-url",
        required=True,
        help="GitHub REST API root, e.g. https://api.github.com or https://ghe.example.com/api/v3",
    )
    p.add_argument("--repository", required=True, help="OWNER/NAME (GitHub's grammar)")
    p.add_argument("--sha", required=True, help="the full 40-hex release commit")
    p.add_argument("--out", required=True, help="output directory (must be empty or absent)")
    p.add_argument("--workflow", default="gpu.yml", help="the qualifying workflow file (default gpu.yml)")
    p.add_argument("--level", default="full_qualification", choices=sorted(LEVEL_ARTIFACTS))
    p.add_argument("--required-gpu-name", default=DEFAULT_GPU, help='required GPU ("none" for cpu-reference)')
    p.add_argument("--dry-run", action="store_true", help="verify everything; never authorize publishing")
    p.add_argument(
        "--deadline-seconds",
        default=str(DEADLINE_SECONDS),
        help=f"wall-clock limit for the whole gate (default {DEADLINE_SECONDS:g})",
    )
    p.add_argument(
        "--download-seconds",
        default=str(DOWNLOAD_SECONDS),
        help=f"wall-clock limit for each download, API page or artifact, redirects included "
        f"(default {DOWNLOAD_SECONDS:g})",
    )


@dataclass
class GateState:
    query: GateQuery | None = None
    run: ChosenRun | None = None
    artifacts: list[ArtifactRef] = field(default_factory=list)
    others: list[OtherRun] = field(default_factory=list)
    checks: list[GateCheck] = field(default_factory=list)
    outputs: list[FileDigest] = field(default_factory=list)
    authorized: bool = False
    reasons: list[str] = field(default_factory=list)

    def passed(self, name: str, detail: str) -> None:
        self.checks.append(GateCheck(name=name, passed=True, detail=detail[:600]))


def seconds(flag: str, value: str) -> float:
    """A positive, finite number of seconds, at most a day."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= MAX_SECONDS):
        raise UsageError(f"{flag} {value[:40]!r} must be a number of seconds in (0, {MAX_SECONDS:g}]", check="usage")
    return number


def parse_deadline(args: argparse.Namespace) -> Deadline:
    """Started now: the gate's clock runs from the moment its arguments are read."""
    total = seconds("--deadline-seconds", str(args.deadline_seconds))
    return Deadline(total, seconds("--download-seconds", str(args.download_seconds)))


def parse_api_url(value: str) -> tuple[str, str]:
    """``(api root without a trailing '/', path prefix without its leading '/')``. GitHub Enterprise serves the
    API under a path (``https://ghe.example.com/api/v3``); every request goes to ``<root>/repos/...``."""
    api = value.rstrip("/")
    try:
        api_origin = origin(api)
    except GateError as exc:
        raise UsageError(f"--api-url: {exc}", check="usage") from None
    parts = urlsplit(api)
    prefix = parts.path[1:]
    if parts.query or parts.fragment or "?" in api or "#" in api or not is_api_path(prefix):
        raise UsageError(
            "--api-url must be scheme://host[:port][/path] without query, fragment, '.' or '..' segments",
            check="usage",
        )
    if api_origin[0] != "https" and api_origin[1] not in _LOOPBACK:
        raise UsageError("--api-url must use https (plain http only on loopback): the token travels", check="usage")
    return api, prefix


def parse_target(args: argparse.Namespace) -> tuple[Target, GateQuery]:
    api, prefix = parse_api_url(str(args.api_url))
    for flag, value, pattern in (("--sha", args.sha, _SHA), ("--workflow", args.workflow, _WORKFLOW)):
        if not pattern.fullmatch(value):
            raise UsageError(f"{flag} {value[:60]!r} must match {pattern.pattern}", check="usage")
    if not is_repository(args.repository):
        raise UsageError(
            f"--repository {args.repository[:60]!r} is not OWNER/NAME: the owner 1-39 of [A-Za-z0-9-] not starting "
            "with '-', the name 1-100 of [A-Za-z0-9._-] and not '.' or '..'",
            check="usage",
        )
    gpu = None if args.required_gpu_name.strip().lower() in ("", "none") else args.required_gpu_name
    t = Target(api=api, repository=args.repository, sha=args.sha, workflow=args.workflow, level=args.level)
    query = GateQuery(
        api_origin=origin_text(origin(api)),
        api_path=prefix,
        repository=t.repository,
        sha=t.sha,
        workflow_path=t.workflow_path,
        level=args.level,
        candidate_artifact=t.artifact_names[0],
        qualification_artifact=t.artifact_names[1],
        required_gpu_name=gpu,
        dry_run=args.dry_run,
    )
    return t, query


def _prepare_out(out: Path) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out.name!r} is not a directory", check="usage")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"--out {out.name!r} is not empty; give a new directory", check="usage")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out.name!r} cannot be created: {exc.strerror}", check="usage") from None


def gate(args: argparse.Namespace, *, limits: ZipLimits | None = None, now: datetime | None = None) -> int:
    """The command. ``limits`` and ``now`` exist for tests (smaller zip bounds, a fixed clock)."""
    out = Path(args.out)
    _prepare_out(out)
    state = GateState()
    failure: HarnessError | None = None
    try:
        deadline = parse_deadline(args)
        t, state.query = parse_target(args)
        token = os.environ.get("GITHUB_TOKEN", "")
        if not token.strip():
            raise UsageError("GITHUB_TOKEN is not set; export a token with actions:read", check="usage")
        _run(t, state, token, out, limits or ZipLimits(), now or datetime.now(UTC), deadline)
    except HarnessError as exc:
        failure = exc
        if isinstance(exc, NoRunError):
            state.others = exc.others
    except ValidationError as exc:  # an API value that a gate.json field refuses
        failure = GateError(f"an API value does not fit gate.json: {exc.errors()[0]['msg']}", check="api_shape")
    except OSError as exc:
        failure = GateError(f"local I/O failed: {exc.__class__.__name__} ({exc.strerror})", check="io")
    if failure is not None and token_in(str(failure)):
        failure = GateError("a message held the token and was withheld", check=failure.check)
    record = _record(state, failure)
    write_record(out / GATE_JSON, record)
    if failure is not None:
        raise failure
    print(
        f"release-gate: passed {len(state.checks)} checks for run {state.run.id if state.run else '?'}; "
        f"release authorized: {record.release_authorized}" + (" (dry run)" if args.dry_run else "")
    )
    return 0


def _run(
    t: Target, state: GateState, token: str, out: Path, limits: ZipLimits, now: datetime, deadline: Deadline
) -> None:
    """Every request checks the deadline before it starts and runs under its watchdog; the local stages between
    them (extraction, candidate check, auditor) are bounded by size and checked for the deadline in between."""
    client = GitHubClient(t.api, token, deadline)
    staging = Path(tempfile.mkdtemp(prefix=".gate-", dir=out))
    try:
        chosen = select_run(client, t, now)
        run = chosen.run
        state.others = chosen.others
        state.run = ChosenRun(
            id=run.id,
            run_attempt=1,
            event="workflow_dispatch",
            path=run.path,
            repository=run.repository.full_name,
            head_sha=run.head_sha,
        )
        for check, detail in chosen.passed:
            state.passed(check, detail)
        work = staging / "work"
        work.mkdir()
        dirs: dict[str, Path] = {}
        for name in t.artifact_names:
            ref, archive = download(client, t, chosen.artifacts[name], work)
            state.artifacts.append(ref)  # in gate.json even when its digest or its zip is refused
            check_digest(ref)
            deadline.check(f"before extracting {name}")
            dirs[name] = extract(archive, name, work, limits)
            digest = "sha256 equals the API digest" if ref.api_digest else "the API gave no digest"
            role = "candidate" if name == t.artifact_names[0] else "qualification"
            state.passed(f"download_{role}", f"{name}: {ref.sha256} ({digest}); extracted safely")
        deadline.check("before the candidate check")
        unpacked = unpack(dirs[t.artifact_names[0]], dirs[t.artifact_names[1]], run, t)
        m = unpacked.manifest
        state.passed("candidate", f"build --check: exact file set, {m.wheel.filename} and {m.sdist.filename} hashes")
        state.passed("source_commit", f"candidate source_commit {m.source_commit}")
        bound = f"{t.repository} {t.workflow_path} run {run.id} attempt 1"
        state.passed("candidate_run", f"candidate-manifest.json workflow: {bound}")
        state.passed("qualification_run", f"qualification.json execution.workflow: {bound}")
        profile = profile_for_gpu(state.query.required_gpu_name if state.query else None)
        known_good = known_good_sha256(unpacked, profile)
        state.passed("known_good_sha256", f"known-good/{profile.known_good}.json {known_good}")
        deadline.check("before the auditor")
        result_dir = staging / "result"
        result_dir.mkdir()
        verification = write_outputs(unpacked, t, known_good, profile, result_dir)
        state.passed("audit", "auditor passed: " + ", ".join(c.name for c in verification.checks))
        state.authorized = verification.release_authorized and t.level == "full_qualification"
        state.reasons = list(verification.authorization_reasons)
        deadline.check("after the auditor")
        if state.query is not None and not state.query.dry_run and not state.authorized:
            raise GateError(
                "the chain verifies but cannot authorize a release: " + "; ".join(state.reasons or ["smoke level"]),
                check="release_authorized",
            )
        for entry in sorted(result_dir.iterdir()):
            entry.rename(out / entry.name)
        state.outputs = [
            FileDigest(filename=p.name, bytes=p.stat().st_size, sha256=sha256_file(p))
            for p in sorted((out / "dist").iterdir())
        ]
    finally:
        client.close()
        shutil.rmtree(staging, ignore_errors=True)


def token_in(text: str) -> bool:
    token = os.environ.get("GITHUB_TOKEN", "").strip()
    return bool(token) and token in text


def scrub(text: str) -> str:
    """Words that look like local paths are replaced; records never hold a path of this machine."""
    words = [("<path>" if looks_like_local_path(w) else w) for w in text.split(" ")]
    return " ".join(words)[:600]


def _record(state: GateState, failure: HarnessError | None) -> GateRecord:
    checks = list(state.checks)
    if failure is not None:
        checks.append(GateCheck(name=failure.check, passed=False, detail=scrub(str(failure))))
    authorized = failure is None and state.authorized and state.query is not None and not state.query.dry_run
    return GateRecord(
        kind="miniverl.release-gate",
        schema_version=1,
        status="failed" if failure is not None else "passed",
        query=state.query,
        run=state.run,
        artifacts=state.artifacts,
        other_runs=state.others,
        checks=checks,
        failed_check=failure.check if failure is not None else None,
        release_authorized=authorized,
        authorization_reasons=state.reasons,
        outputs=state.outputs,
    )
