"""Known-good stacks: ``known-good/<name>.txt`` (exact pins) + ``<name>.json`` (descriptor); live recording."""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

from pydantic import ValidationError

from harness.build.candidate import EXTRA_INDEX_OPTION, normalize, read_extra_index_urls, read_pins
from harness.core.errors import StackError, ToolchainError
from harness.core.jsonio import atomic_write_bytes, sha256_bytes, sha256_file
from harness.core.proc import REPO_ROOT, clean_env, last_line, run
from harness.core.recordio import load_record, record_bytes
from harness.core.records import GpuFacts, KnownGoodDescriptor, Profile

KNOWN_GOOD_DIR = REPO_ROOT / "known-good"

# Runs inside the target interpreter (stdlib only): the installed closure of miniverl[extras].
CLOSURE_SCRIPT = r"""
import json, re, sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:  # every venv has pip, and pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement
def norm(n): return re.sub(r"[-_.]+", "-", n).lower()
dists = {}
for d in metadata.distributions():
    name = d.metadata["Name"]
    if name:
        dists.setdefault(norm(name), d)
root, extras = sys.argv[1], set(json.loads(sys.argv[2]))
seen, missing, todo = {}, set(), [(norm(root), {norm(e) for e in extras})]
while todo:
    name, want = todo.pop()
    dist = dists.get(name)
    if dist is None:
        missing.add(name)
        continue
    if name in seen and want <= seen[name]:
        continue
    seen[name] = seen.get(name, set()) | want
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (seen[name] or {""})):
            continue
        todo.append((norm(req.name), {norm(x) for x in req.extras}))
out = {n: dists[n].version for n in sorted(seen) if n != norm(root)}
print(json.dumps({"packages": out, "missing": sorted(missing), "python": ".".join(map(str, sys.version_info[:3]))}))
"""


def descriptor_paths(name: str, directory: Path = KNOWN_GOOD_DIR) -> tuple[Path, Path]:
    return directory / f"{name}.txt", directory / f"{name}.json"


def load_known_good(profile: Profile, directory: Path = KNOWN_GOOD_DIR) -> tuple[KnownGoodDescriptor, str]:
    """The profile's descriptor and the sha256 of its bytes, after checking it against its ``.txt``."""
    txt, js = descriptor_paths(profile.known_good, directory)
    for path in (txt, js):
        if path.is_symlink() or not path.is_file():
            raise StackError(f"known-good/{path.name} is missing; record it with `python -m harness stack record`")
    descriptor = load_record(KnownGoodDescriptor, js, f"known-good/{js.name}")
    if descriptor.name != profile.known_good or descriptor.constraints_file != txt.name:
        raise StackError(f"known-good/{js.name} names {descriptor.name!r}, profile wants {profile.known_good!r}")
    if descriptor.required_gpu_name != profile.required_gpu_name:
        raise StackError(
            f"known-good/{js.name} requires GPU {descriptor.required_gpu_name!r}, profile {profile.required_gpu_name!r}"
        )
    if sha256_file(txt) != descriptor.constraints_sha256:
        raise StackError(f"known-good/{txt.name} does not match constraints_sha256 in {js.name}")
    try:
        pins, index_urls = read_pins(txt), read_extra_index_urls(txt)
    except ToolchainError as exc:
        raise StackError(str(exc)) from None
    if pins != descriptor.packages:
        raise StackError(f"known-good/{js.name} packages differ from the pins in {txt.name}")
    if index_urls != descriptor.extra_index_urls:
        raise StackError(
            f"known-good/{js.name} extra_index_urls {descriptor.extra_index_urls} differ from the "
            f"{EXTRA_INDEX_OPTION} lines of {txt.name} {index_urls}"
        )
    unserved = local_pins_without_index(descriptor)
    if unserved:
        raise StackError(
            f"known-good/{js.name} pins {', '.join(unserved)}: a local version the default index does not serve, "
            f"and it names no {EXTRA_INDEX_OPTION} to fetch it from"
        )
    return descriptor, sha256_file(js)


def local_pins_without_index(descriptor: KnownGoodDescriptor) -> list[str]:
    """``name==version+label`` pins of a descriptor that lists no extra index (PyPI serves no local versions)."""
    if descriptor.extra_index_urls:
        return []
    return [f"{n}=={v}" for n, v in sorted(descriptor.packages.items()) if "+" in v]


def stack_mismatches(pins: dict[str, str], installed: dict[str, str]) -> list[str]:
    """Installed packages the known-good file does not pin, or pins at another version.

    The file constrains, it does not require: pins for packages outside miniverl's installed closure
    (dev tools, other extras) are allowed. A pin without a local label matches ``+cpu``/``+cu130`` builds.
    """
    problems = []
    for name, have in sorted((normalize(k), v) for k, v in installed.items()):
        want = pins.get(name)
        if want is None:
            problems.append(f"{name}=={have} is installed but not pinned by the known-good stack")
        elif have != want and not ("+" not in want and have.split("+", 1)[0] == want):
            problems.append(f"{name} is {have}, known-good pins {want}")
    return problems


def installed_closure(python: Path, extras: list[str], cwd: Path) -> tuple[dict[str, str], list[str], str]:
    """(packages, missing requirement names, python version) for ``miniverl[extras]`` in ``python``."""
    done = run([python, "-I", "-c", CLOSURE_SCRIPT, "miniverl", json.dumps(extras)], cwd=cwd, env=clean_env())
    if done.returncode != 0:
        raise StackError(f"could not list the installed stack: {last_line(done.stderr)}", check="stack_record")
    data = json.loads(done.stdout)
    return dict(data["packages"]), list(data["missing"]), str(data["python"])


NVIDIA_SMI_QUERY = ("--query-gpu=name,driver_version,memory.total", "--format=csv")
NVIDIA_SMI_HEADER = "name, driver_version, memory.total [MiB]"


def nvidia_smi() -> str | None:
    """What ``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv`` printed (no torch); None where
    the machine has no ``nvidia-smi`` or it failed."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    done = run([exe, *NVIDIA_SMI_QUERY], timeout=60)
    return done.stdout.decode("utf-8", "replace") if done.returncode == 0 else None


def parse_nvidia_smi_csv(text: str) -> GpuFacts:
    """GPU name, count, memory and driver from ``nvidia-smi``'s CSV with its header; ValueError on anything else."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or lines[0] != NVIDIA_SMI_HEADER:
        raise ValueError(f"not nvidia-smi's CSV: the header is not {NVIDIA_SMI_HEADER!r}")
    rows = [[c.strip() for c in ln.split(",")] for ln in lines[1:]]
    if not rows or any(len(r) != 3 or not r[0] or not r[2].endswith(" MiB") for r in rows):
        raise ValueError("nvidia-smi's CSV has no row of name, driver_version, memory.total [MiB]")
    names = {r[0] for r in rows}
    mib = rows[0][2].removesuffix(" MiB")
    return GpuFacts(
        name=rows[0][0] if len(names) == 1 else " + ".join(sorted(names)),
        count=len(rows),
        total_memory_bytes=int(mib) * (1 << 20) if mib.isdigit() else None,
        driver=rows[0][1] or None,
    )


def gpu_facts(raw: str | None = None) -> GpuFacts | None:
    """The GPU ``nvidia-smi`` names (``raw``: its captured output; else it is run now); None without a GPU."""
    text = nvidia_smi() if raw is None else raw
    try:
        return parse_nvidia_smi_csv(text) if text else None
    except ValueError:
        return None


def write_known_good(
    profile: Profile,
    packages: dict[str, str],
    python_version: str,
    gpu: GpuFacts | None,
    directory: Path,
    *,
    status: str = "measured",
    notes: str = "",
    extra_index_urls: list[str] | None = None,
) -> KnownGoodDescriptor:
    """Write ``<name>.txt`` and ``<name>.json`` (atomically) for ``profile`` from measured packages."""
    if profile.required_gpu_name is not None and (gpu is None or gpu.name != profile.required_gpu_name):
        raise StackError(
            f"profile {profile.name} requires {profile.required_gpu_name!r}, "
            f"this machine has {gpu.name if gpu else 'no GPU'!r}",
            check="gpu_identity",
        )
    txt, js = descriptor_paths(profile.known_good, directory)
    lines = [
        f"# known-good stack {profile.name}: {status} "
        f"({platform.system()} {platform.machine()}, Python {python_version})"
    ]
    pins = {normalize(k): v for k, v in packages.items()}
    lines += [f"{EXTRA_INDEX_OPTION} {url}" for url in extra_index_urls or []]
    lines += [f"{name}=={pins[name]}" for name in sorted(pins)]
    text = ("\n".join(lines) + "\n").encode()
    descriptor = _descriptor(
        profile,
        status,
        python=python_version,
        platform=f"{platform.system()}-{platform.machine()}".lower(),
        packages=dict(sorted(pins.items())),
        constraints_file=txt.name,
        constraints_sha256=sha256_bytes(text),
        recorded={
            "gpu_count": gpu.count if gpu else None,
            "gpu_total_memory_bytes": gpu.total_memory_bytes if gpu else None,
            "gpu_driver": gpu.driver if gpu else None,
        },
        notes=notes,
        extra_index_urls=list(extra_index_urls or []),
    )
    atomic_write_bytes(txt, text)
    atomic_write_bytes(js, record_bytes(descriptor))
    return descriptor


def check_index_urls(urls: list[str]) -> None:
    """Refuse an extra index URL the descriptor could not record (before anything is installed from it)."""
    from pydantic import TypeAdapter

    from harness.core.records import IndexUrl

    for url in urls:
        try:
            TypeAdapter(IndexUrl).validate_python(url)
        except ValidationError:
            raise StackError(
                f"--extra-index-url {url[:120]!r} is not an https URL (or http on 127.0.0.1) without credentials, "
                "query or fragment",
                check="stack_record",
            ) from None


def _descriptor(profile: Profile, status: str, **fields: object) -> KnownGoodDescriptor:
    """``profile``'s descriptor, ``status`` measured or else declared, or one StackError line naming the field that
    does not validate (a bad index URL)."""
    own = {
        "kind": "miniverl.known-good",
        "schema_version": 1,
        "name": profile.known_good,
        "status": "measured" if status == "measured" else "declared",
        "required_gpu_name": profile.required_gpu_name,
    }
    try:
        return KnownGoodDescriptor.model_validate(own | fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise StackError(f"the known-good descriptor fails its schema at {where}: {first['msg']}") from None


def describe_existing(
    profile: Profile, directory: Path, *, status: str, python_version: str, platform_name: str, notes: str
) -> KnownGoodDescriptor:
    """Write ``<name>.json`` for an existing hand-written or frozen ``<name>.txt`` (bytes unchanged)."""
    txt, js = descriptor_paths(profile.known_good, directory)
    try:
        pins, index_urls = read_pins(txt), read_extra_index_urls(txt)
    except (OSError, ToolchainError) as exc:
        raise StackError(f"known-good/{txt.name}: {exc}") from None
    descriptor = _descriptor(
        profile,
        status,
        python=python_version,
        platform=platform_name,
        packages=dict(sorted(pins.items())),
        constraints_file=txt.name,
        constraints_sha256=sha256_file(txt),
        notes=notes,
        extra_index_urls=index_urls,
    )
    atomic_write_bytes(js, record_bytes(descriptor))
    return descriptor
