"""Helpers for the harness tests (imported by conftest and the tests)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
# Python source that makes any later import of torch or miniverl fatal (a meta-path guard), for ``python -c``.
NO_TORCH_GUARD = (
    "import sys\n"
    "class G:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'miniverl'): raise SystemExit('imported ' + name)\n"
    "sys.meta_path.insert(0, G())\n"
)
FAKEPROJ = HERE / "fakeproj"

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_repo(dest: Path) -> Path:
    shutil.copytree(FAKEPROJ, dest, dirs_exist_ok=True)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "fixture")
    return dest


def run_smoke_into(
    out: Path, candidate: Path, repo: Path, known_good: Path, level: str = "release_smoke", **options: Any
) -> int:
    """The cpu-reference smoke (or ``level``) of ``candidate`` into ``out``; ``options``: other SmokeOptions."""
    from harness.core.profiles import PROFILES
    from harness.qualify.options import SmokeOptions
    from harness.qualify.smoke import run_smoke

    opts = SmokeOptions(
        profile=PROFILES["cpu-reference"],
        out=out,
        level=level,
        candidate=candidate,
        repo=repo,
        base_python=Path(sys.executable),
        known_good_dir=known_good,
        **options,
    )
    return run_smoke(opts)


def kg_sha(known_good: Path) -> str:
    from harness.core.jsonio import sha256_file

    return sha256_file(known_good / "cpu-reference.json")


def audit_args(candidate: Path, qual: Path, known_good: Path, **over: str) -> list[str]:
    commit = over.get("--commit") or json.loads((candidate / "candidate-manifest.json").read_bytes())["source_commit"]
    args = {
        "--candidate-dir": str(candidate),
        "--candidate-manifest": str(candidate / "candidate-manifest.json"),
        "--qualification": str(qual / "qualification.json"),
        "--commit": commit,
        "--known-good-sha256": over.get("--known-good-sha256") or kg_sha(known_good),
        "--known-good": str(known_good / "cpu-reference.json"),
        "--required-gpu-name": "none",
        "--level": "release_smoke",
    }
    args.update(over)
    return [x for k, v in args.items() if v is not None for x in (k, v)]


def run_cli(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)


def rewrite_json(path: Path, edit: Callable[[Any], None]) -> None:
    from harness.core.jsonio import canonical_bytes

    value = json.loads(path.read_bytes())
    edit(value)
    path.write_bytes(canonical_bytes(value) + b"\n")


def audit(args: list[str]) -> tuple[int, dict[str, Any], str]:
    """Run scripts/validate_release_chain.py; returns (exit code, release-verification, stderr)."""
    done = run_cli("scripts/validate_release_chain.py", *args)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest, symlinks=True)
    return dest


FULL_FIXTURES = Path(__file__).parent / "full_fixtures"


def fabricate_full(smoke_qual: Path, dest: Path) -> Path:
    """A full_qualification dir: the real smoke plus each full workload's record, judged by the real harness judge
    from real evidence captured on a cpu-reference run (tests/harness/full_fixtures/<workload>/<archive member>).

    The evidence came from another run, of another candidate: each fixture transcript is re-bound to this
    stand-in candidate's wheel (:func:`rebind_transcript`, what a forger would have to do; without it the
    ``candidate_bound`` check refuses the splice). A workload with no implementation or no fixture gets a stand-in
    record whose checks claim to pass; the auditor's re-judging refuses those.
    """
    import tempfile

    from harness.core import policy, registry
    from harness.core.jsonio import canonical_bytes, sha256_file
    from harness.core.profiles import PROFILES
    from harness.core.recordio import load_record, record_bytes
    from harness.core.records import CheckResult, Checks, Qualification, WorkloadRecord, WorkloadResult
    from harness.qualify.full.catalog import implemented
    from harness.qualify.full.runner import judged
    from harness.qualify.full.scales import SCALES
    from harness.qualify.qualification import write_workload

    copy_tree(smoke_qual, dest)
    q = load_record(Qualification, dest / "qualification.json")
    smoke = load_record(WorkloadRecord, dest / "qualification-release-smoke.json")
    profile = PROFILES[q.profile.name]
    value = q.model_dump(mode="json")
    results = [w for w in value["workloads"] if w["name"] == "release-smoke"]
    for spec in registry.REGISTRY.workloads[1:]:
        workload = implemented(spec.name)
        fixtures = FULL_FIXTURES / spec.name
        if workload is not None and fixtures.is_dir():
            # Laid out as `python -m harness workload NAME --out` writes them: by archive member.
            scratch = Path(tempfile.mkdtemp(prefix="spliced-"))
            evidence = {}
            for role, member in workload.evidence.items():
                if (fixtures / member).is_file():
                    evidence[role] = scratch / member
                    evidence[role].parent.mkdir(parents=True, exist_ok=True)
                    data = (fixtures / member).read_bytes()
                    rebound = rebind_transcript(data, q.candidate.wheel.sha256) if role == "transcript" else data
                    evidence[role].write_bytes(rebound)
            outcome = judged(workload, evidence, profile, SCALES[profile.name], wheel_sha256=q.candidate.wheel.sha256)
            result, artifacts = write_workload(
                dest,
                outcome,
                source_commit=q.candidate.source_commit,
                wheel_sha256=q.candidate.wheel.sha256,
                profile=profile.name,
            )
            value["artifacts"] += [a.model_dump(mode="json") for a in artifacts]
            results.append(result.model_dump(mode="json"))
            continue
        required = policy.record_checks(profile, spec.name)
        checks = Checks(
            required=required,
            executed=[CheckResult(name=c, passed=True, detail="stand-in") for c in required],
            skipped=[],
            not_applicable=[],
        )
        record = smoke.model_copy(
            update={"name": spec.name, "level": "full_qualification", "artifacts": [], "checks": checks, "metrics": {}}
        )
        path = dest / spec.principal_record
        path.write_bytes(record_bytes(record))
        value["artifacts"].append(
            {
                "path": path.name,
                "role": policy.record_artifact_role(spec),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        )
        results.append(
            WorkloadResult(
                name=spec.name, principal_record=spec.principal_record, status="passed", reasons=[]
            ).model_dump(mode="json")
        )
    value["workloads"] = results
    value["artifacts"].sort(key=lambda a: a["path"])
    value["level"] = "full_qualification"
    Qualification.model_validate(value)
    (dest / "qualification.json").write_bytes(canonical_bytes(value) + b"\n")
    return dest


def rebind_artifacts(q: Path) -> None:
    """Every artifact's bytes and sha256, in qualification.json and in the smoke record, set to the files as they
    are now: what a forger who edited evidence would do (the auditor must then catch the edit by re-judging)."""
    from harness.core.jsonio import canonical_bytes, sha256_file
    from harness.core.registry import SMOKE_RECORD

    smoke = json.loads((q / SMOKE_RECORD).read_bytes())
    for art in smoke["artifacts"]:
        art.update(bytes=(q / art["path"]).stat().st_size, sha256=sha256_file(q / art["path"]))
    (q / SMOKE_RECORD).write_bytes(canonical_bytes(smoke) + b"\n")
    record = json.loads((q / "qualification.json").read_bytes())
    for art in record["artifacts"]:
        art.update(bytes=(q / art["path"]).stat().st_size, sha256=sha256_file(q / art["path"]))
    (q / "qualification.json").write_bytes(canonical_bytes(record) + b"\n")


def rebind_transcript(data: bytes, wheel_sha256: str) -> bytes:
    """A transcript whose every invocation claims to have run ``wheel_sha256`` from the proven origins: a test
    stand-in for evidence spliced from another candidate's run (no harness code writes this)."""
    from harness.core.jsonio import canonical_bytes

    doc = json.loads(data)
    for inv in doc["invocations"]:
        program = inv["argv"][0]
        own = program == "miniverl"
        root = "<venv>/lib/python3.11/site-packages" if own else "<verl-overlay>"
        inv["installed"] = {
            "wheel_sha256": wheel_sha256,
            "import_origin": f"{root}/miniverl/__init__.py",
            "executable": "<venv>/bin/miniverl" if own else program,
        }
    return canonical_bytes(doc) + b"\n"


def build_assets(candidate: Path, qual: Path, out: Path, known_good: Path, **kw: Any) -> Path:
    from harness.audit.release_assets import build_release_assets

    return build_release_assets(
        candidate,
        qual,
        out,
        profile="cpu-reference",
        known_good_sha256=kg_sha(known_good),
        required_gpu_name=None,
        known_good=known_good / "cpu-reference.json",
        **kw,
    )


def candidate_fixed_under_the_current_policy(candidate: Path, dest: Path) -> Path:
    """A copy of ``candidate`` whose manifest fixes the criteria of the policy in effect in this process, which is
    what ``harness build`` writes under it (under :func:`release_card_test_variant`: the release card's scale with
    the stand-in models). The wheel, the sdist and SHA256SUMS are the same bytes."""
    from harness.build.candidate import MANIFEST
    from harness.core.policy import fixed_criteria
    from harness.core.recordio import load_record, record_bytes
    from harness.core.records import CandidateManifest

    copy_tree(candidate, dest)
    manifest = load_record(CandidateManifest, dest / MANIFEST)
    (dest / MANIFEST).write_bytes(record_bytes(manifest.model_copy(update={"criteria": fixed_criteria()})))
    return dest


def relabel_for_profile(
    full: Path,
    dest: Path,
    profile_name: str,
    descriptor: Path,
    *,
    smoke_evidence: bool = False,
    candidate: Path | None = None,
) -> Path:
    """A fabricated full qualification re-labelled as a run of ``profile_name`` on its GPU, consistent with the
    harness policy for that profile (its CUDA checks executed and passed, measured bytes within thresholds).

    Only the records say so unless ``smoke_evidence``: then the smoke's evidence is re-written too (doctor names the
    GPU, the OPD summary holds a CUDA block, ``full_evidence.CUDA_FIGURES``), as a CUDA run records them. The
    auditor re-judges the smoke from its evidence, so only the deeper stand-in can drive an authorizing path.
    The stand-in CLI really ran on the CPU and no harness code writes this. Every record is rewritten and re-bound;
    with ``candidate`` (:func:`candidate_fixed_under_the_current_policy`), the qualification binds its manifest.
    """
    from full_evidence import CUDA_FIGURES

    from harness.core import policy
    from harness.core.jsonio import canonical_bytes, sha256_file
    from harness.core.profiles import PROFILES, profile_sha256

    copy_tree(full, dest)
    profile = PROFILES[profile_name]
    kg_sha = sha256_file(descriptor)

    def consistent(record: Any, workload: str) -> None:
        required = policy.record_checks(profile, workload)
        executed = {c["name"]: c for c in record["checks"]["executed"]}
        record["checks"] = {
            "required": required,
            "executed": [executed.get(n, {"name": n, "passed": True, "detail": "stand-in"}) for n in required],
            "skipped": [],
            "not_applicable": [],
        }

    value = json.loads((dest / "qualification.json").read_bytes())
    consistent(value, "release-smoke")
    value["checks"]["executed"] += [
        {"name": n, "passed": True, "detail": "stand-in"} for n in registry_evidence_checks(value)
    ]
    value["profile"].update(
        name=profile.name,
        sha256=profile_sha256(profile),
        known_good=profile.known_good,
        known_good_sha256=kg_sha,
        known_good_status="measured",
        can_authorize_release=profile.can_authorize_release,
    )
    if candidate is not None:
        value["candidate"]["manifest_sha256"] = sha256_file(candidate / "candidate-manifest.json")
    value["environment"].update(
        device=profile.device,
        known_good_sha256=kg_sha,
        gpu={"name": profile.required_gpu_name, "count": 1, "total_memory_bytes": 16 << 30, "driver": "580"},
    )
    t = profile.thresholds
    figures = {
        "cuda_baseline_allocated_bytes": CUDA_FIGURES["baseline_allocated_bytes"],
        "cuda_final_allocated_bytes": CUDA_FIGURES["final_allocated_bytes"],
        "cuda_peak_reserved_bytes": CUDA_FIGURES["peak_reserved_bytes"],
        "cuda_peak_allocated_bytes": CUDA_FIGURES["peak_allocated_bytes"],
        "cuda_teardown_tolerance_bytes": max(t.teardown_tolerance_bytes_min, 0),
    }
    value["metrics"].update(figures)
    smoke = dest / policy.PRINCIPALS[0].filename
    record = json.loads(smoke.read_bytes())
    record["profile"] = profile.name
    record["metrics"].update(figures)
    consistent(record, "release-smoke")
    if smoke_evidence:
        doctor, summary = dest / "evidence" / "doctor.json", dest / "evidence" / "run" / "summary.json"
        d = json.loads(doctor.read_bytes())
        d["gpu_name"] = profile.required_gpu_name
        d["capabilities"]["gpu_training"] = {"verdict": "ok"}
        doctor.write_bytes(canonical_bytes(d) + b"\n")
        u = json.loads(summary.read_bytes())
        u["cuda"] = dict(CUDA_FIGURES)
        summary.write_bytes(canonical_bytes(u) + b"\n")
        # what nvidia-smi prints on that GPU (the record's environment.gpu above: one card, 16 GiB, driver 580)
        smi = dest / "evidence" / "install" / "nvidia-smi.csv"
        smi.write_text(f"name, driver_version, memory.total [MiB]\n{profile.required_gpu_name}, 580, 16384 MiB\n")
        for doc in (value, record):
            doc["artifacts"] = sorted(
                [
                    *(a for a in doc["artifacts"] if a["role"] != "nvidia_smi"),
                    {"path": "evidence/install/nvidia-smi.csv", "role": "nvidia_smi", "bytes": 0, "sha256": "0" * 64},
                ],
                key=lambda a: a["path"],
            )
        for art in [*value["artifacts"], *record["artifacts"]]:
            if art["path"] in {"evidence/doctor.json", "evidence/run/summary.json", "evidence/install/nvidia-smi.csv"}:
                path = dest / art["path"]
                art.update(bytes=path.stat().st_size, sha256=sha256_file(path))
    smoke.write_bytes(canonical_bytes(record) + b"\n")
    for art in value["artifacts"]:
        if art["path"] == smoke.name:
            art.update(bytes=smoke.stat().st_size, sha256=sha256_file(smoke))
    _rejudge_as_cuda(dest, value, profile)
    # as the harness writes it: failed, with each workload's reasons, where a re-judged workload failed
    reasons = [r for w in value["workloads"][1:] for r in w["reasons"]]
    value.update(status="failed" if reasons else "passed", reasons=reasons)
    (dest / "qualification.json").write_bytes(canonical_bytes(value) + b"\n")
    return dest


def _rejudge_as_cuda(dest: Path, value: Any, profile: Any) -> None:
    """Give each full workload's CPU evidence what a CUDA run records (:func:`full_evidence.as_cuda_bytes`; the
    backend matrix's gate and speed evidence is the real one captured on the H200), then re-judge it with the
    real judge on ``profile`` and rewrite its record and bindings."""
    import tempfile

    from full_evidence import as_cuda_bytes

    from harness.core import registry
    from harness.core.records import Artifact
    from harness.qualify.full.catalog import implemented
    from harness.qualify.full.runner import judged
    from harness.qualify.full.scales import SCALES
    from harness.qualify.qualification import write_workload

    scratch = Path(tempfile.mkdtemp(prefix="cuda-evidence-"))
    results = {w["name"]: w for w in value["workloads"]}
    for spec in registry.REGISTRY.workloads[1:]:
        workload = implemented(spec.name)
        if workload is None:
            continue
        evidence: dict[str, Path] = {}
        for role, member in workload.evidence.items():
            source = dest / "evidence" / member
            if not source.is_file():
                continue
            copy = scratch / member
            copy.parent.mkdir(parents=True, exist_ok=True)
            measured_on_h200 = FULL_FIXTURES / spec.name / "h200-cu130" / member
            vllm_on_h100 = FULL_FIXTURES / spec.name / VLLM_RUN_ON_THE_H100 / member
            if vllm_on_h100.is_file():
                copy.write_bytes(vllm_on_h100.read_bytes())
            elif measured_on_h200.is_file():
                data = measured_on_h200.read_bytes()
                wheel = value["candidate"]["wheel"]["sha256"]
                copy.write_bytes(rebind_transcript(data, wheel) if role == "transcript" else data)
            else:
                copy.write_bytes(as_cuda_bytes(source.read_bytes(), spec.name, role, SCALES[profile.name]))
            evidence[role] = copy
        for role, member in workload.evidence.items():  # the vLLM run's files the CPU run never had
            vllm_on_h100 = FULL_FIXTURES / spec.name / VLLM_RUN_ON_THE_H100 / member
            if role not in evidence and vllm_on_h100.is_file():
                evidence[role] = scratch / member
                evidence[role].parent.mkdir(parents=True, exist_ok=True)
                evidence[role].write_bytes(vllm_on_h100.read_bytes())
        if spec.name == "backend-matrix":
            _cuda_backend_matrix_stand_ins(evidence)
        wheel = value["candidate"]["wheel"]["sha256"]
        outcome = judged(workload, evidence, profile, SCALES[profile.name], wheel_sha256=wheel)
        result, artifacts = write_workload(
            dest,
            outcome,
            source_commit=value["candidate"]["source_commit"],
            wheel_sha256=value["candidate"]["wheel"]["sha256"],
            profile=profile.name,
        )
        fresh: dict[str, Artifact] = {a.path: a for a in artifacts}
        value["artifacts"] = [a for a in value["artifacts"] if a["path"] not in fresh] + [
            a.model_dump(mode="json") for a in artifacts
        ]
        results[spec.name] = result.model_dump(mode="json")
    value["artifacts"].sort(key=lambda a: a["path"])
    value["workloads"] = [results[w["name"]] for w in value["workloads"]]


#: the backend matrix's vLLM refresh run as the H100 qualification at 02b33ed kept it (its README says where from):
#: a CUDA-relabelled chain's vLLM evidence is that real run's, never another engine's lines
VLLM_RUN_ON_THE_H100 = "h100-cu130-vllm"


def _cuda_backend_matrix_stand_ins(evidence: dict[str, Path]) -> None:
    """Test stand-ins for what the H200 evidence lacks: interleaved pairs in its bench (it predates them; each pair
    repeats the H200 cells' own median timings). Nothing stands in for vLLM: its evidence is the real run on the
    H100 (:data:`VLLM_RUN_ON_THE_H100`)."""
    from harness.qualify.full.backend_matrix import load_preregistration

    bench = json.loads(evidence["rollout_bench"].read_bytes())
    b = load_preregistration()[0].speed.bench
    seconds = {c["path"]: c["median_seconds"] for c in bench["cells"] if c["batch"] == b.batch}
    fast, base = seconds[b.fast_path], seconds[b.baseline_path]
    pairs = [{"a_seconds": fast, "b_seconds": base, "ratio": base / fast}] * b.pairs
    entry = {"a": b.fast_path, "b": b.baseline_path, "batch": b.batch, "status": "measured", "order": "ABAB"}
    bench["comparisons"] = [{**entry, "pairs": pairs, "median_ratio": base / fast}]
    bench["options"].update(pair=[b.fast_path, b.baseline_path], pairs=b.pairs)
    evidence["rollout_bench"].write_text(json.dumps(bench))


@contextlib.contextmanager
def release_card_test_variant() -> Iterator[None]:
    """TEST-ONLY variant of the release card, in this process only, for what this machine cannot run there: the
    release card's scale declares the SmolLM2 and tiny-classifier stand-ins instead of the seed's Qwen3-0.6B and
    DistilBERT (no hub here). Everything else is the real policy, ``vllm_boundary`` included, which the chain meets
    with the real vLLM run kept from the H100 (:data:`VLLM_RUN_ON_THE_H100`). While it is in effect, a release-card
    chain relabelled from the CPU run can reach the rest of the authorization path (the gate, the auditor's
    re-judging, release assets) without any fake model evidence; under the real scale the same chain is refused
    (tests assert both). No harness code can select it: it exists only here, and a subprocess never sees it."""
    with pytest.MonkeyPatch.context() as mp:
        use_release_card_test_variant(mp)
        yield


def use_release_card_test_variant(mp: pytest.MonkeyPatch) -> None:
    """Put :func:`release_card_test_variant` in effect until ``mp`` is undone (a test's ``monkeypatch``)."""
    from dataclasses import replace

    from harness.qualify.full.scales import SCALES, STAND_INS

    card = "rtx4080-wsl2-cu130"
    mp.setitem(SCALES, card, replace(SCALES[card], models=STAND_INS))


def registry_evidence_checks(record: Any) -> list[str]:
    executed = {c["name"] for c in record["checks"]["executed"]}
    return [n for n in ("evidence_portable", "evidence_bounded") if n not in executed]
