"""The release card's stack installs from its known-good record: torch==2.11.0+cu130 from the extra index it names.

A static PEP 503 ``simple/`` tree on 127.0.0.1 (http.server in a thread) stands in for both indexes: ``/simple/``
for PyPI (it serves torch 2.11.0 without a local label, as PyPI does) and ``/whl/cu130/`` for the cu130 torch index
(torch 2.11.0+cu130 and the nvidia wheel it requires). The wheels are tiny stand-ins built here as real wheel zips.
The harness's own install path (load_known_good, fresh_venv, install_candidate, the closure script, the install
judge) runs against them; a wrong index, a missing local version and a pip report from elsewhere are refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import sys
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest

from harness.build.stacks import installed_closure, load_known_good, stack_mismatches, write_known_good
from harness.core.errors import InstallError, StackError
from harness.core.jsonio import canonical_bytes
from harness.core.proc import Redactor
from harness.core.profiles import PROFILES
from harness.core.records import GpuFacts
from harness.install.venv import (
    CapturedInstall,
    InstallOptions,
    fresh_venv,
    install_argv,
    install_candidate,
    interpreter_version,
    pip_output,
)
from harness.qualify.install_judge import INSTALL_FILES, InstallBasis, judge_install, require_python

CARD = PROFILES["rtx4080-wsl2-cu130"]
CARD_GPU = GpuFacts(name="NVIDIA GeForce RTX 4080", count=1, total_memory_bytes=16 << 30, driver="test")
PINS = {"filelock": "4.3.1", "nvidia-cublas": "13.1.0.3", "torch": "2.11.0+cu130"}
PYTHON = platform.python_version()


def _wheel(directory: Path, name: str, version: str, requires: list[str], extras: tuple[str, ...] = ()) -> Path:
    """A minimal valid wheel: one module, METADATA, WHEEL and a RECORD with the files' hashes."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
        f"{name.replace('-', '_')}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{dist}.dist-info/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
            + [f"Provides-Extra: {e}" for e in extras]
            + [f"Requires-Dist: {r}" for r in requires]
        ).encode()
        + b"\n",
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    out = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(f"{dist}.dist-info/RECORD", record + f"{dist}.dist-info/RECORD,,\n")
    return out


def _index(root: Path, prefix: str, wheels: list[Path]) -> None:
    """``root/prefix/<project>/index.html`` linking each wheel (PEP 503, with its sha256 fragment)."""
    by_project: dict[str, list[Path]] = {}
    for wheel in wheels:
        by_project.setdefault(wheel.name.split("-")[0].replace("_", "-"), []).append(wheel)
    for project, files in by_project.items():
        page = root / prefix / project
        page.mkdir(parents=True)
        links = "".join(
            f'<a href="/files/{quote(w.name)}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
            for w in files
        )
        (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Index:
    url: str  # http://127.0.0.1:PORT
    candidate: Path
    candidate_sha256: str


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    root = tmp_path_factory.mktemp("index")
    files = root / "files"
    files.mkdir()
    built = tmp_path_factory.mktemp("wheels")
    candidate = _wheel(built, "miniverl", "0.1.0", ['torch==2.11.0; extra == "train"'], extras=("train",))
    cublas = _wheel(files, "nvidia-cublas", "13.1.0.3", [])
    cu130 = _wheel(files, "torch", "2.11.0+cu130", ['nvidia-cublas==13.1.0.3; platform_system == "Linux"', "filelock"])
    _index(root, "simple", [_wheel(files, "torch", "2.11.0", ["filelock"]), _wheel(files, "filelock", "4.3.1", [])])
    _index(root, "whl/cu130", [cu130, cublas])
    _index(root, "whl/cu128", [_wheel(files, "torch", "2.11.0+cu128", ["filelock"]), cublas])
    _index(root, "whl/unlabelled", [_wheel(files, "torch", "2.11.0", ["filelock"]), cublas])
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    # This machine has no PyPI: pip's primary index is the local /simple/ (the release card's is PyPI's default).
    # Nothing else from the machine's pip configuration may add or swap an index.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PIP_INDEX_URL", f"{url}/simple/")
        env.setenv("PIP_CONFIG_FILE", os.devnull)
        for name in (
            "PIP_EXTRA_INDEX_URL",
            "PIP_FIND_LINKS",
            "PIP_NO_INDEX",
            "PIP_CONSTRAINT",
            "PIP_REQUIRE_VIRTUALENV",
        ):
            env.delenv(name, raising=False)
        yield Index(url=url, candidate=candidate, candidate_sha256=hashlib.sha256(candidate.read_bytes()).hexdigest())
    server.shutdown()
    server.server_close()


def _known_good(directory: Path, extra_index_urls: list[str]) -> Path:
    """The release card's descriptor pair for the stand-in stack (as `stack record` writes it)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_known_good(CARD, PINS, PYTHON, CARD_GPU, directory, status="declared", extra_index_urls=extra_index_urls)
    return directory


def _options(directory: Path) -> InstallOptions:
    descriptor, _ = load_known_good(CARD, directory)
    return InstallOptions(
        base_python=Path(sys.executable),
        constraint=directory / f"{CARD.known_good}.txt",
        extras=["train"],
        extra_index_urls=tuple(descriptor.extra_index_urls),
    )


@dataclass(frozen=True)
class Installed:
    evidence: dict[str, Path]
    basis: InstallBasis
    packages: dict[str, str]
    missing: list[str]
    argv: list[str]


@pytest.fixture(scope="module")
def installed(index: Index, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The real install path, once: a fresh venv, the Python refused or not from its captured sys.version, then pip
    under the known-good constraints with the descriptor's extra index, its report and pip inspect captured."""
    work = tmp_path_factory.mktemp("work")
    kg = _known_good(work / "known-good", [f"{index.url}/whl/cu130"])
    options = _options(kg)
    python = fresh_venv(work / "venv", options, work=work)
    captured = work / "install"
    captured.mkdir()
    evidence = {role: captured / name for role, name in INSTALL_FILES.items()}
    evidence["python_version"].write_text(interpreter_version(python, work))
    require_python(evidence["python_version"], PYTHON)
    evidence["pyvenv_cfg"].write_text((work / "venv" / "pyvenv.cfg").read_text())
    argv = install_candidate(
        python,
        index.candidate,
        index.candidate_sha256,
        options,
        work=work,
        redact=Redactor({"work": work}),
        captured=CapturedInstall(wheel_sha256=evidence["wheel_sha256"], pip_report=evidence["pip_report"]),
    )
    evidence["pip_inspect"].write_text(pip_output(python, work, "inspect"))
    packages, missing, _ = installed_closure(python, ["train"], work)
    descriptor, _ = load_known_good(CARD, kg)
    basis = InstallBasis(
        commit="0" * 40,
        version="0.1.0",
        wheel_filename=index.candidate.name,
        wheel_sha256=index.candidate_sha256,
        extras=("train",),
        pins=dict(descriptor.packages),
        python_pin=descriptor.python,
        index_urls=tuple(descriptor.extra_index_urls),
    )
    return Installed(evidence, basis, packages, missing, argv)


@pytest.fixture(scope="module")
def bare(index: Index, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh venv nothing is installed into: each refused install must leave it so."""
    work = tmp_path_factory.mktemp("bare")
    return fresh_venv(work / "venv", InstallOptions(Path(sys.executable), None), work=work), work


def _stack_check(evidence: dict[str, Path], basis: InstallBasis) -> tuple[bool, str]:
    return judge_install(evidence, basis).checks["stack_matches_known_good"]


def test_torch_cu130_installs_from_the_known_good_extra_index(installed: Installed, index: Index) -> None:
    assert installed.argv.count("--extra-index-url") == 1
    assert installed.argv[installed.argv.index("--extra-index-url") + 1] == f"{index.url}/whl/cu130"
    assert installed.packages == PINS and installed.missing == []
    assert stack_mismatches(PINS, installed.packages) == []  # `stack check`'s rule over the live closure
    ok, detail = _stack_check(installed.evidence, installed.basis)
    assert ok, detail
    assert f"torch 2.11.0+cu130 from {index.url}" in detail  # pip's report says which index served it


def test_the_descriptor_binds_the_index_in_both_files(tmp_path: Path) -> None:
    kg = _known_good(tmp_path, ["https://download.pytorch.org/whl/cu130"])
    txt = (kg / f"{CARD.known_good}.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cu130\n" in txt
    descriptor, _ = load_known_good(CARD, kg)
    assert descriptor.extra_index_urls == ["https://download.pytorch.org/whl/cu130"]
    # another index in the json alone (its constraints_sha256 still matches the txt) is refused
    js = kg / f"{CARD.known_good}.json"
    doc = json.loads(js.read_bytes())
    js.write_bytes(canonical_bytes({**doc, "extra_index_urls": ["https://download.pytorch.org/whl/cu128"]}))
    with pytest.raises(StackError, match="extra_index_urls"):
        load_known_good(CARD, kg)
    # and an edited index line in the txt no longer matches constraints_sha256
    _known_good(tmp_path, ["https://download.pytorch.org/whl/cu130"])
    (kg / f"{CARD.known_good}.txt").write_text(txt.replace("/cu130", "/cu128"))
    with pytest.raises(StackError, match="constraints_sha256"):
        load_known_good(CARD, kg)


def test_a_local_version_pin_without_an_index_is_refused_by_name(tmp_path: Path) -> None:
    _known_good(tmp_path, [])
    with pytest.raises(StackError, match=r"torch==2\.11\.0\+cu130.*names no --extra-index-url"):
        load_known_good(CARD, tmp_path)
    with pytest.raises(StackError, match="extra_index_urls"):
        _known_good(tmp_path / "other", ["http://example.com/whl/cu130"])  # plain http off the loopback


def test_the_committed_release_card_names_the_cu130_index() -> None:
    descriptor, _ = load_known_good(CARD)
    assert descriptor.extra_index_urls == ["https://download.pytorch.org/whl/cu130"]
    assert descriptor.packages["torch"] == "2.11.0+cu130" and descriptor.packages["triton"] == "3.6.0"
    assert {n for n in descriptor.packages if n.startswith("nvidia-")} >= {"nvidia-cublas", "nvidia-cudnn-cu13"}
    offline = install_argv(Path("python"), Path("w.whl"), InstallOptions(Path("p"), None, offline_wheels=Path("d")))
    assert "--extra-index-url" not in offline  # carried wheels only: no index at all


@pytest.mark.parametrize(
    ("where", "why"),
    [("whl/cu128", "wrong index"), ("whl/unlabelled", "the index has torch 2.11.0 but no +cu130")],
)
def test_an_index_without_the_local_version_is_refused_by_name(
    where: str, why: str, index: Index, bare: tuple[Path, Path], tmp_path: Path
) -> None:
    kg = _known_good(tmp_path / "kg", [f"{index.url}/{where}"])
    python, work = bare
    before = pip_output(python, work, "freeze", "--all")
    with pytest.raises(InstallError, match=rf"torch.*2\.11\.0\+cu130.*extra indexes: {index.url}/{where}") as err:
        install_candidate(python, index.candidate, index.candidate_sha256, _options(kg), work=work, redact=Redactor({}))
    assert err.value.check == "install", why
    assert pip_output(python, work, "freeze", "--all") == before  # nothing installed or removed


def test_a_report_of_torch_from_elsewhere_fails_the_stack_check(installed: Installed, tmp_path: Path) -> None:
    evidence = dict(installed.evidence)
    report = json.loads(evidence["pip_report"].read_bytes())
    for item in report["install"]:
        if item["metadata"]["name"] == "torch":
            item["download_info"]["url"] = "https://files.pythonhosted.org/packages/torch-2.11.0+cu130-py3-none-any.whl"
    evidence["pip_report"] = tmp_path / "edited.json"
    evidence["pip_report"].write_bytes(canonical_bytes(report))
    ok, detail = _stack_check(evidence, installed.basis)
    assert not ok and "torch 2.11.0+cu130 came from https://files.pythonhosted.org" in detail


def test_a_missing_or_swapped_report_fails_the_stack_check(installed: Installed) -> None:
    missing = {k: v for k, v in installed.evidence.items() if k != "pip_report"}
    ok, detail = _stack_check(missing, installed.basis)
    assert not ok and "cannot show which index served them" in detail
    swapped = {**installed.evidence, "pip_report": installed.evidence["pip_inspect"]}
    ok, detail = _stack_check(swapped, installed.basis)
    assert not ok and "not pip's installation report" in detail


def test_a_report_from_another_run_fails_the_stack_check(installed: Installed) -> None:
    """The same report judged against another run's index (another port on 127.0.0.1) is not what it names."""
    other = InstallBasis(**{**installed.basis.__dict__, "index_urls": ("http://127.0.0.1:1/whl/cu130",)})
    ok, detail = _stack_check(installed.evidence, other)
    assert not ok and "not from the known-good extra index http://127.0.0.1:1/whl/cu130" in detail


def test_the_profile_python_is_enforced_before_install(installed: Installed, tmp_path: Path) -> None:
    captured = installed.evidence["python_version"]
    require_python(captured, PYTHON)
    with pytest.raises(InstallError, match=rf"Python is {PYTHON}, the known-good stack pins Python 3\.12\.13") as err:
        require_python(captured, "3.12.13")  # the release card's
    assert err.value.check == "python_version"
    swapped = installed.evidence["pip_inspect"]
    with pytest.raises(InstallError, match=r"not sys\.version"):
        require_python(swapped, PYTHON)


def test_a_pyvenv_version_that_only_starts_with_the_python_fails(installed: Installed, tmp_path: Path) -> None:
    """pyvenv.cfg of another interpreter (3.11.7 vs 3.11.73) no longer passes as a prefix match."""
    assert judge_install(installed.evidence, installed.basis).checks["python_version"][0]
    cfg = installed.evidence["pyvenv_cfg"].read_text()
    edited = tmp_path / "pyvenv.cfg"
    edited.write_text(
        cfg.replace(f"version = {PYTHON}", f"version = {PYTHON}3").replace(
            f"version_info = {PYTHON}", f"version_info = {PYTHON}3"
        )
    )
    assert edited.read_text() != cfg
    ok, _ = judge_install({**installed.evidence, "pyvenv_cfg": edited}, installed.basis).checks["python_version"]
    assert not ok
