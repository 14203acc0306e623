"""The candidate: exactly one wheel + one sdist built from a git export of HEAD, SHA256SUMS, a strict manifest."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from harness.core.errors import BuildError, CandidateError, RecordError, SourceError, ToolchainError, UsageError
from harness.core.jsonio import atomic_write_bytes, fsync_tree, replace_dir, sha256_bytes, sha256_file
from harness.core.policy import fixed_criteria
from harness.core.proc import HARNESS_DIR, clean_env, git, last_line, run
from harness.core.recordio import parse_record, record_bytes
from harness.core.records import (
    BuildEnvironment,
    CandidateManifest,
    FileDigest,
    GithubActionsBinding,
    LocalBinding,
    Toolchain,
)
from harness.core.safeio import MANIFEST_MAX_BYTES, SUMS_MAX_BYTES, read_regular, regular_file_size, require_directory

MANIFEST = "candidate-manifest.json"
SUMS = "SHA256SUMS"
BUILD_CONSTRAINTS = HARNESS_DIR / "constraints-build.txt"
TOOLCHAIN = ("build", "hatchling", "twine")
MAX_CANDIDATE_ENTRIES = 16


EXTRA_INDEX_OPTION = "--extra-index-url"


def read_pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a constraints file (comments, blanks and ``--extra-index-url`` lines ignored;
    names normalized)."""
    pins: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.split(None, 1)[0] == EXTRA_INDEX_OPTION:
            continue
        name, sep, version = line.partition("==")
        if not sep or not version.strip() or any(c in version for c in "<>=!~,; "):
            raise ToolchainError(f"{path.name}: {line!r} is not an exact name==version pin", check="constraints")
        pins[normalize(name)] = version.strip()
    return pins


def read_extra_index_urls(path: Path) -> list[str]:
    """The ``--extra-index-url URL`` lines of a constraints file, in order (pip reads them there too)."""
    urls = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        words = raw.split("#", 1)[0].split()
        if words and words[0] == EXTRA_INDEX_OPTION:
            if len(words) != 2:
                what = f"{path.name}: {raw.strip()!r}"
                raise ToolchainError(f"{what} is not `{EXTRA_INDEX_OPTION} URL`", check="constraints")
            urls.append(words[1])
    return urls


def normalize(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", "-").replace(".", "-").split("-"))


def toolchain() -> Toolchain:
    """The versions of build, hatchling and twine in this interpreter; refused unless they equal the pins."""
    pins = read_pins(BUILD_CONSTRAINTS)
    found: dict[str, str] = {}
    for name in TOOLCHAIN:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise ToolchainError(
                f"{name} is not installed; run `nox -s build` or `pip install -r harness/constraints-build.txt`"
            ) from None
        if found[name] != pins.get(name):
            raise ToolchainError(
                f"{name} {found[name]} is installed but harness/constraints-build.txt pins {pins.get(name)}"
            )
    return Toolchain(
        build=found["build"],
        hatchling=found["hatchling"],
        twine=found["twine"],
        constraints_sha256=sha256_file(BUILD_CONSTRAINTS),
    )


def workflow_binding(env: dict[str, str] | None = None) -> LocalBinding | GithubActionsBinding:
    """``github_actions`` (repository, workflow path, run id, attempt) inside Actions; ``local`` otherwise."""
    env = dict(os.environ) if env is None else env
    if env.get("GITHUB_ACTIONS") != "true":
        return LocalBinding(kind="local")
    missing = [
        k for k in ("GITHUB_REPOSITORY", "GITHUB_WORKFLOW_REF", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT") if not env.get(k)
    ]
    if missing:
        raise UsageError(f"GitHub Actions binding lacks {', '.join(missing)}", check="workflow_binding")
    repository = env["GITHUB_REPOSITORY"]
    ref = env["GITHUB_WORKFLOW_REF"].split("@", 1)[0]
    path = ref[len(repository) + 1 :] if ref.startswith(repository + "/") else ref
    attempt = int(env["GITHUB_RUN_ATTEMPT"])
    if attempt != 1:
        raise UsageError(
            f"GITHUB_RUN_ATTEMPT is {attempt}; every dispatch is single-use: start a new workflow_dispatch",
            check="run_attempt",
        )
    return GithubActionsBinding(
        kind="github_actions",
        repository=repository,
        workflow_path=path,
        run_id=int(env["GITHUB_RUN_ID"]),
        run_attempt=attempt,
    )


def workflow_ref(env: dict[str, str] | None = None) -> str | None:
    """The ref of ``GITHUB_WORKFLOW_REF`` (``owner/name/.github/workflows/gpu.yml@refs/heads/main``) inside Actions."""
    env = dict(os.environ) if env is None else env
    if env.get("GITHUB_ACTIONS") != "true":
        return None
    _, sep, ref = env.get("GITHUB_WORKFLOW_REF", "").partition("@")
    if not sep or not ref.startswith("refs/"):
        raise UsageError("GITHUB_WORKFLOW_REF has no @refs/... ref", check="workflow_binding")
    return ref


def worktree_changes(repo: Path) -> int:
    """Number of changed or untracked (not ignored) paths in the checkout."""
    status = git(repo, "status", "--porcelain", "--untracked-files=normal")
    return len([ln for ln in status.splitlines() if ln.strip()])


def _export_head(repo: Path, dest: Path) -> None:
    tar_path = dest.parent / "source.tar"
    done = run(["git", "-C", repo, "archive", "--format=tar", "-o", tar_path, "HEAD"], env=clean_env())
    if done.returncode != 0:
        raise SourceError(f"git archive HEAD failed: {last_line(done.stderr)}")
    with tarfile.open(tar_path) as archive:
        archive.extractall(dest, filter="data")
    tar_path.unlink()


def build_candidate(
    repo: Path, out_dir: Path, *, env: dict[str, str] | None = None, force: bool = False
) -> CandidateManifest:
    """Build HEAD of ``repo`` into ``out_dir``; every manifest field derives from the commit, so a rebuild is
    byte-identical. An existing ``out_dir`` with other bytes is kept unless ``force`` (qualifications bind it)."""
    tools = toolchain()
    binding, ref = workflow_binding(env), workflow_ref(env)
    commit = git(repo, "rev-parse", "HEAD")
    epoch = int(git(repo, "log", "-1", "--format=%ct", "HEAD"))
    clean = worktree_changes(repo) == 0
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="miniverl-build-") as tmp_name:
        tmp = Path(tmp_name)
        src, dist = tmp / "src", tmp / "dist"
        src.mkdir()
        _export_head(repo, src)
        build_env = clean_env({"SOURCE_DATE_EPOCH": str(epoch)})
        done = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, src], env=build_env, cwd=tmp)
        if done.returncode != 0:
            raise BuildError(f"python -m build failed: {last_line(done.stderr) or last_line(done.stdout)}")
        wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
        if len(wheels) != 1 or len(sdists) != 1 or len(list(dist.iterdir())) != 2:
            raise BuildError(f"expected exactly one wheel and one sdist, got {sorted(p.name for p in dist.iterdir())}")
        done = run([sys.executable, "-m", "twine", "check", "--strict", wheels[0], sdists[0]], env=build_env)
        if done.returncode != 0:
            raise BuildError(
                f"twine check --strict failed: {last_line(done.stdout) or last_line(done.stderr)}", check="twine"
            )
        wheel, sdist = _digest(wheels[0]), _digest(sdists[0])
        version = wheel.filename.split("-")[1]
        manifest = CandidateManifest(
            kind="miniverl.candidate-manifest",
            schema_version=2,
            source_commit=commit,
            version=version,
            created_at=datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            source_date_epoch=epoch,
            source_tree="git-archive",
            worktree_clean=clean,
            workflow=binding,
            workflow_ref=ref,
            build=BuildEnvironment(
                os=f"{platform.system()} {platform.release()}",
                machine=platform.machine(),
                python=platform.python_version(),
                toolchain=tools,
            ),
            wheel=wheel,
            sdist=sdist,
            # fixed on the hosted runner before any GPU work: the auditor refuses a qualification judged by others
            criteria=fixed_criteria(),
        )
        staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        try:
            for item in (wheels[0], sdists[0]):
                shutil.copyfile(item, staging / item.name)
                os.chmod(staging / item.name, 0o644)
            atomic_write_bytes(staging / SUMS, sums_text([wheel, sdist]).encode())
            atomic_write_bytes(staging / MANIFEST, record_bytes(manifest))
            os.chmod(staging, 0o755)
            fsync_tree(staging)
            check_candidate(staging)
            if _same_files(staging, out_dir):
                shutil.rmtree(staging)
                return manifest
            if out_dir.exists() and not force:
                raise CandidateError(
                    f"{out_dir.name}/ already holds other bytes (qualifications may bind it); "
                    "remove it or pass --force to replace it",
                    check="candidate_overwrite",
                )
            replace_dir(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return manifest


def _same_files(new: Path, old: Path) -> bool:
    if old.is_symlink() or not old.is_dir():
        return False
    names = sorted(p.name for p in new.iterdir())
    if sorted(p.name for p in old.iterdir()) != names:
        return False
    return all(
        (old / n).is_file() and not (old / n).is_symlink() and sha256_file(old / n) == sha256_file(new / n)
        for n in names
    )


def _digest(path: Path) -> FileDigest:
    return FileDigest(filename=path.name, bytes=path.stat().st_size, sha256=sha256_file(path))


def sums_text(files: list[FileDigest]) -> str:
    return "".join(f"{f.sha256}  {f.filename}\n" for f in files)


def check_candidate(directory: Path, manifest_path: Path | None = None) -> CandidateManifest:
    """Re-validate a candidate directory; raises ``CandidateError`` naming the failed check."""
    require_directory(directory, f"candidate directory {directory.name!r}", check="candidate_dir", error=CandidateError)
    entries: dict[str, Path] = {}
    with os.scandir(directory) as listing:
        for entry in listing:
            if len(entries) >= MAX_CANDIDATE_ENTRIES:
                raise CandidateError(
                    f"candidate dir holds more than {MAX_CANDIDATE_ENTRIES} entries", check="candidate_file_set"
                )
            entries[entry.name] = Path(entry.path)
    for name, path in sorted(entries.items()):
        regular_file_size(path, name, check="candidate_file_type", error=CandidateError)
    if MANIFEST not in entries:
        raise CandidateError(f"{MANIFEST} is missing", check="candidate_file_set")
    data = read_regular(
        entries[MANIFEST], MANIFEST, max_bytes=MANIFEST_MAX_BYTES, check="candidate_manifest", error=CandidateError
    )
    if manifest_path is not None:
        given = read_regular(
            manifest_path,
            "--candidate-manifest",
            max_bytes=MANIFEST_MAX_BYTES,
            check="candidate_manifest",
            error=CandidateError,
        )
        if given != data:
            raise CandidateError(
                "the given candidate manifest differs from the one in the candidate dir", check="candidate_manifest"
            )
    manifest = _parse_manifest(data)
    expected = {MANIFEST, SUMS, manifest.wheel.filename, manifest.sdist.filename}
    if set(entries) != expected:
        extra, missing = sorted(set(entries) - expected), sorted(expected - set(entries))
        raise CandidateError(
            f"candidate dir must hold exactly {sorted(expected)}; extra {extra}, missing {missing}",
            check="candidate_file_set",
        )
    if data != record_bytes(manifest):
        raise CandidateError(f"{MANIFEST} is not canonical JSON", check="candidate_manifest")
    sums = read_regular(entries[SUMS], SUMS, max_bytes=SUMS_MAX_BYTES, check="sha256sums", error=CandidateError)
    if sums != sums_text([manifest.wheel, manifest.sdist]).encode():
        raise CandidateError(
            "SHA256SUMS is not the canonical wheel-then-sdist listing of the manifest's hashes", check="sha256sums"
        )
    for role, digest in (("wheel", manifest.wheel), ("sdist", manifest.sdist)):
        path = entries[digest.filename]
        size = regular_file_size(path, digest.filename, check="candidate_file_type", error=CandidateError)
        if size != digest.bytes:
            raise CandidateError(
                f"{digest.filename}: {size} bytes, manifest says {digest.bytes}", check=f"{role}_bytes"
            )
        if sha256_file(path) != digest.sha256:
            raise CandidateError(f"{digest.filename}: sha256 differs from the manifest", check=f"{role}_sha256")
    return manifest


def _parse_manifest(data: bytes) -> CandidateManifest:
    try:
        return parse_record(CandidateManifest, data, MANIFEST)
    except RecordError as exc:  # re-labelled so the failed check names the manifest
        raise CandidateError(str(exc), check="candidate_manifest") from None


def manifest_sha256(directory: Path) -> str:
    return sha256_bytes((directory / MANIFEST).read_bytes())
