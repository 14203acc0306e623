"""``python -m harness``: build, smoke, full, stack, release-assets, verify, schemas, release-gate."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import HarnessError, UsageError
from harness.core.proc import REPO_ROOT
from harness.core.safeio import check_output_dir

if TYPE_CHECKING:
    from harness.install.vllm_site import VllmSite

DEFAULT_CANDIDATE = REPO_ROOT / "out" / "candidate"


def _build(args: argparse.Namespace) -> int:
    from harness.build.candidate import build_candidate, check_candidate

    out = Path(args.out)
    if args.check:
        manifest = check_candidate(out)
        print(f"candidate ok: {manifest.wheel.filename} {manifest.sdist.filename} ({manifest.source_commit[:12]})")
        return 0
    check_output_dir(out, "--out")  # before anything is built: never a file, FIFO, device or symlink
    manifest = build_candidate(Path(args.repo), out, force=args.force)
    print(f"candidate built: {manifest.wheel.filename} {manifest.wheel.sha256}")
    return 0


def _smoke(args: argparse.Namespace, level: str) -> int:
    from harness.core.profiles import get_profile
    from harness.qualify.options import SmokeOptions
    from harness.qualify.smoke import run_smoke

    check_output_dir(Path(args.out), "--out")
    opts = SmokeOptions(
        profile=get_profile(args.profile),
        out=Path(args.out),
        level=level,
        candidate=Path(args.candidate).resolve() if args.candidate else None,
        repo=Path(args.repo),
        base_python=Path(args.base_python),
        system_site_packages=args.system_site_packages,
        offline_wheels=_dir(args.offline_wheels, "--offline-wheels"),
        known_good_dir=Path(args.known_good_dir).resolve(),
        work=Path(args.work) if args.work else None,
        keep_work=args.keep_work,
        model_cache=Path(args.model_cache).resolve() if args.model_cache else None,
        grpo=not args.skip_grpo,
        verl_python=_verl_python(getattr(args, "verl_python", None), required=level == "full_qualification"),
        vllm_site=_vllm_site(getattr(args, "vllm_site", None)),
    )
    return run_smoke(opts)  # at the full level it first checks that verl_python imports verl 0.9.1


def _verl_python(value: str | None, *, required: bool) -> Path | None:
    """An interpreter whose environment has verl 0.9.1 (`make verl-env` builds one); the path itself is not
    resolved, so a venv's python stays the venv's (and a wrapper script stays the wrapper)."""
    from harness.install.verl_env import MISSING

    if value is None:
        if required:
            raise UsageError(MISSING, check="verl_python")
        return None
    path = Path(value).absolute()
    if not path.is_file():
        raise UsageError(f"--verl-python {value!r} is not a file; {MISSING}", check="verl_python")
    return path


def _vllm_site(value: str | None) -> VllmSite | None:
    """The vLLM site's digest, taken before anything is built, installed or written (None: no site given)."""
    from harness.install.vllm_site import read_site

    return read_site(Path(value).resolve()) if value is not None else None


def _dir(value: str | None, flag: str) -> Path | None:
    if value is None:
        return None
    path = Path(value).resolve()
    if not path.is_dir():
        raise UsageError(f"{flag} {value!r} is not a directory", check="usage")
    return path


def _stack(args: argparse.Namespace) -> int:
    from harness.build.candidate import check_candidate
    from harness.build.stacks import (
        check_index_urls,
        gpu_facts,
        installed_closure,
        load_known_good,
        write_known_good,
    )
    from harness.core.proc import Redactor
    from harness.core.profiles import get_profile
    from harness.install.venv import InstallOptions, fresh_venv, install_candidate

    profile = get_profile(args.profile)
    if args.action == "describe":
        from harness.build.stacks import describe_existing

        d = describe_existing(
            profile,
            Path(args.known_good_dir),
            status=args.status,
            python_version=args.python_version,
            platform_name=args.platform,
            notes=args.notes,
        )
        print(f"wrote known-good/{d.name}.json ({d.status}, {len(d.packages)} pins)")
        return 0
    if args.action == "check":
        descriptor, digest = load_known_good(profile, Path(args.known_good_dir))
        print(f"{descriptor.name}: {descriptor.status}, {len(descriptor.packages)} pins, sha256 {digest}")
        return 0
    check_index_urls(args.extra_index_url)
    candidate = Path(args.candidate).resolve()
    manifest = check_candidate(candidate)
    with tempfile.TemporaryDirectory(prefix="miniverl-stack-") as tmp:
        work = Path(tmp)
        options = InstallOptions(
            base_python=Path(args.base_python),
            constraint=None,
            extras=profile.install_extras,
            system_site_packages=args.system_site_packages,
            offline_wheels=_dir(args.offline_wheels, "--offline-wheels"),
            extra_index_urls=tuple(args.extra_index_url),
        )
        python = fresh_venv(work / "venv", options, work=work)
        install_candidate(
            python,
            candidate / manifest.wheel.filename,
            manifest.wheel.sha256,
            options,
            work=work,
            redact=Redactor({"work": work}),
        )
        packages, missing, version = installed_closure(python, profile.install_extras, work)
    if missing:
        raise UsageError(
            f"requirements not installed in the recorded stack: {', '.join(missing)}", check="stack_record"
        )
    descriptor = write_known_good(
        profile,
        packages,
        version,
        gpu_facts(),
        Path(args.known_good_dir),
        notes=f"recorded by `python -m harness stack record` for miniverl {manifest.version}",
        extra_index_urls=list(args.extra_index_url),
    )
    print(f"wrote known-good/{descriptor.name}.txt and .json: {len(packages)} pins ({descriptor.status})")
    return 0


def _assets(args: argparse.Namespace) -> int:
    from harness.audit.cli import checkout_request
    from harness.audit.release_assets import build_release_assets

    # The bindings to trust come from this checkout and the profile, never from the records being packed.
    check_output_dir(Path(args.out), "--out")
    req = checkout_request(args.profile, "full_qualification", assets=False)
    out = build_release_assets(
        Path(args.candidate),
        Path(args.qualification_dir),
        Path(args.out),
        profile=args.profile,
        known_good_sha256=req.known_good_sha256,
        required_gpu_name=req.required_gpu_name,
        known_good=req.known_good,
        replace_existing=args.replace,
    )
    print(f"release assets written to {out.name}/")
    return 0


def _schemas(args: argparse.Namespace) -> int:
    from harness.core import schemas

    if args.check:
        problems = schemas.drift()
        if problems:
            raise UsageError(
                f"manifests/harness drifted: {problems[0]}; run `python -m harness schemas`", check="schema_drift"
            )
        print("manifests/harness is up to date")
        return 0
    for name in schemas.write():
        print(f"wrote manifests/harness/{name}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from harness.audit.cli import run_audit

    return run_audit(args)


def _verify_checkout(args: argparse.Namespace) -> int:
    from harness.audit.auditor import audit
    from harness.audit.cli import checkout_request, report

    request = checkout_request(args.profile, args.level, assets=args.assets, gate_record=args.gate_record)
    return report(audit(request), args.out)


def _release_gate(args: argparse.Namespace) -> int:
    from harness.gate.main import gate

    return gate(args)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the candidate (one wheel + one sdist) from a git export of HEAD")
    b.add_argument("--out", default=str(DEFAULT_CANDIDATE))
    b.add_argument("--repo", default=str(REPO_ROOT))
    b.add_argument("--check", action="store_true", help="re-validate an existing candidate dir instead")
    b.add_argument("--force", action="store_true", help="replace an existing candidate dir that holds other bytes")
    for name in ("smoke", "full"):
        s = sub.add_parser(
            name, help=f"{'release smoke' if name == 'smoke' else 'full qualification'} on the installed CLI"
        )
        s.add_argument("--profile", required=True)
        s.add_argument("--out", default=str(REPO_ROOT / "out" / "qualification"))
        s.add_argument("--candidate", help="validate and use this candidate dir instead of building one")
        s.add_argument("--repo", default=str(REPO_ROOT))
        s.add_argument("--base-python", default=sys.executable, help="interpreter the fresh venv is made from")
        s.add_argument("--system-site-packages", action="store_true", help="venv over the machine's own torch")
        s.add_argument("--offline-wheels", help="no index: install the wheel + these wheels with --no-deps")
        s.add_argument("--known-good-dir", default=str(REPO_ROOT / "known-good"))
        s.add_argument("--work", help="scratch dir outside the checkout (default: a new temp dir)")
        s.add_argument("--keep-work", action="store_true")
        s.add_argument("--model-cache", help="MINIVERL_CACHE for the installed CLI (runner-local, never uploaded)")
        s.add_argument(
            "--skip-grpo",
            action="store_true",
            help="skip the GRPO cycle (local diagnosis only: the auditor's policy requires it)",
        )
        if name == "full":
            s.add_argument(
                "--verl-python",
                help="required: python of verl 0.9.1's own environment (`make verl-env`: .nox/verl_env/bin/python); "
                "the handoff diagnosis runs there with the candidate overlaid",
            )
            s.add_argument(
                "--vllm-site",
                help="a vLLM site (pip --target; scripts/device/vllm.sh install) the CLI processes see after the "
                "venv's own site; its files' digest is recorded in the qualification",
            )
    st = sub.add_parser("stack", help="known-good stacks: check, or record from a live environment")
    st.add_argument("action", choices=["check", "record", "describe"])
    st.add_argument("--status", choices=["measured", "declared"], default="declared", help="describe only")
    st.add_argument("--python-version", default="3.11.7", help="describe only")
    st.add_argument("--platform", default="linux-x86_64", help="describe only")
    st.add_argument("--notes", default="", help="describe only")
    st.add_argument("--profile", required=True)
    st.add_argument("--candidate", default=str(DEFAULT_CANDIDATE))
    st.add_argument("--base-python", default=sys.executable)
    st.add_argument("--system-site-packages", action="store_true")
    st.add_argument("--offline-wheels")
    st.add_argument(
        "--extra-index-url",
        action="append",
        default=[],
        help="record only: an index pip also installs from, kept in the descriptor (e.g. the cu130 torch index)",
    )
    st.add_argument("--known-good-dir", default=str(REPO_ROOT / "known-good"))
    a = sub.add_parser("release-assets", help="build the canonical release-asset directory")
    a.add_argument("--candidate", default=str(DEFAULT_CANDIDATE))
    a.add_argument("--qualification-dir", default=str(REPO_ROOT / "out" / "qualification"))
    a.add_argument("--out", default=str(REPO_ROOT / "out" / "release-assets"))
    a.add_argument("--profile", required=True, help="the profile the qualification must have used")
    a.add_argument("--replace", action="store_true")
    sc = sub.add_parser("schemas", help="regenerate manifests/harness (or --check for drift)")
    sc.add_argument("--check", action="store_true")
    from harness.audit.cli import add_arguments

    add_arguments(sub.add_parser("verify", help="the torch-free auditor (scripts/validate_release_chain.py)"))
    vc = sub.add_parser(
        "verify-checkout", help="audit out/ with the commit, known-good hash and GPU taken from this checkout"
    )
    vc.add_argument("--profile", required=True)
    vc.add_argument("--level", required=True, choices=["release_smoke", "full_qualification"])
    vc.add_argument("--assets", action="store_true", help="also audit out/release-assets")
    vc.add_argument("--gate-record", help="a release's gate.json, compared with the statements (needs --assets)")
    vc.add_argument("--out", default=str(REPO_ROOT / "out" / "release-verification.json"))
    from harness.gate.main import add_arguments as add_gate_arguments
    from harness.qualify.full.probe import add_arguments as add_workload_arguments

    add_workload_arguments(sub.add_parser("workload", help="run one full workload against an existing venv (dev)"))
    add_gate_arguments(sub.add_parser("release-gate", help="verify one gpu.yml run through the GitHub API"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "build":
            return _build(args)
        if args.command in ("smoke", "full"):
            return _smoke(args, "release_smoke" if args.command == "smoke" else "full_qualification")
        if args.command == "stack":
            return _stack(args)
        if args.command == "release-assets":
            return _assets(args)
        if args.command == "schemas":
            return _schemas(args)
        if args.command == "verify-checkout":
            return _verify_checkout(args)
        if args.command == "release-gate":
            return _release_gate(args)
        if args.command == "workload":
            from harness.qualify.full.probe import probe

            return probe(args)
        return _verify(args)
    except HarnessError as exc:
        print(f"harness: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("harness: error: [interrupted] stopped by the user", file=sys.stderr)
        return 130


def dump(value: object) -> str:
    return json.dumps(value, sort_keys=True)
