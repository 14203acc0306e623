"""Argument handling for the auditor: ``scripts/validate_release_chain.py`` and ``python -m harness verify``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.audit.auditor import audit
from harness.audit.request import AuditRequest
from harness.core.audit_records import ReleaseVerification
from harness.core.errors import HarnessError, UsageError
from harness.core.recordio import record_bytes, write_record


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--candidate-dir", required=True)
    p.add_argument("--candidate-manifest", required=True)
    p.add_argument("--qualification", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--known-good-sha256", required=True, help="sha256 of known-good/<profile>.json you trust")
    p.add_argument(
        "--known-good",
        help="the known-good descriptor file (default: known-good/<profile>.json inside the candidate's sdist)",
    )
    p.add_argument("--required-gpu-name", required=True, help='the GPU the profile requires ("none" for cpu-reference)')
    p.add_argument("--assets-dir", help="also re-verify a release-asset directory")
    p.add_argument(
        "--gate-record",
        help="the release gate's gate.json (published beside the assets): its run, attempt and wheel must be the "
        "statements' (needs --assets-dir)",
    )
    p.add_argument("--level", default="full_qualification", help="release_smoke or full_qualification")
    p.add_argument("--profile", help="the profile the qualification must have used")
    p.add_argument("--out", help="write release-verification.json here (default: print it)")


def output_file(out: str | None) -> Path | None:
    """``--out`` names the file to write: not a directory, and its nearest existing ancestor is a directory (the
    missing ones are made). Checked before the audit so that a bad path is one ``[output]`` line (exit 2) and
    nothing is written."""
    if not out:
        return None
    from harness.core.safeio import check_output_file

    path = Path(out)
    if path.is_dir() and not path.is_symlink():
        raise UsageError(
            f"--out {out!r} is a directory; give the file to write, e.g. {path / 'release-verification.json'}",
            check="output",
        )
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise UsageError(f"--out {out!r}: {str(above)!r} is not a directory", check="output")
    check_output_file(path, "--out")
    return path


def run_audit(args: argparse.Namespace) -> int:
    output_file(args.out)
    gpu = None if args.required_gpu_name == "none" else args.required_gpu_name
    req = AuditRequest(
        candidate_dir=Path(args.candidate_dir),
        candidate_manifest=Path(args.candidate_manifest),
        qualification=Path(args.qualification),
        commit=args.commit,
        known_good_sha256=args.known_good_sha256,
        required_gpu_name=gpu,
        level=args.level,
        known_good=Path(args.known_good) if args.known_good else None,
        assets_dir=Path(args.assets_dir) if args.assets_dir else None,
        profile=args.profile,
        gate_record=Path(args.gate_record) if args.gate_record else None,
    )
    return report(audit(req), args.out)


def checkout_request(profile_name: str, level: str, *, assets: bool, gate_record: str | None = None) -> AuditRequest:
    """The audit of ``out/`` in this checkout. Nothing is taken from the files being verified: the commit is
    ``git rev-parse HEAD``, the known-good sha256 is the hash of ``known-good/<profile>.json`` as committed,
    the GPU name comes from the harness profile and the level from the command. ``gate_record`` (a release's
    ``gate.json``) is compared with the statements of ``out/release-assets``."""
    from harness.core.jsonio import sha256_bytes
    from harness.core.proc import REPO_ROOT, git
    from harness.core.profiles import get_profile
    from harness.core.safeio import MANIFEST_MAX_BYTES, read_regular

    profile = get_profile(profile_name)
    known_good = REPO_ROOT / "known-good" / f"{profile.known_good}.json"
    data = read_regular(known_good, f"known-good/{known_good.name}", max_bytes=MANIFEST_MAX_BYTES, check="known_good")
    out = REPO_ROOT / "out"
    return AuditRequest(
        candidate_dir=out / "candidate",
        candidate_manifest=out / "candidate" / "candidate-manifest.json",
        qualification=out / "qualification" / "qualification.json",
        commit=git(REPO_ROOT, "rev-parse", "HEAD"),
        known_good_sha256=sha256_bytes(data),
        required_gpu_name=profile.required_gpu_name,
        level=level,
        known_good=known_good,
        assets_dir=out / "release-assets" if assets else None,
        profile=profile.name,
        gate_record=Path(gate_record) if gate_record else None,
    )


def report(result: ReleaseVerification, out: str | None) -> int:
    path = output_file(out)
    if path is not None:
        try:
            write_record(path, result)
        except OSError as exc:
            raise UsageError(f"--out {out!r} cannot be written: {exc.strerror}", check="output") from None
    else:
        sys.stdout.write(record_bytes(result).decode())
    if result.status != "passed":
        first = next(c for c in result.checks if not c.passed)
        print(f"validate_release_chain: error: [{first.name}] {first.detail}", file=sys.stderr)
        return 1
    print(
        f"validate_release_chain: passed {len(result.checks)} checks; release authorized: "
        f"{result.release_authorized}"
        + (f" ({'; '.join(result.authorization_reasons)})" if result.authorization_reasons else ""),
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="validate_release_chain.py", description="Torch-free release-chain auditor.")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run_audit(args)
    except HarnessError as exc:
        print(f"validate_release_chain: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"validate_release_chain: error: [io] {exc.__class__.__name__}: {exc.strerror}", file=sys.stderr)
        return 1
