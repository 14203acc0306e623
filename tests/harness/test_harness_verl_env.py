"""verl's environment for the handoff diagnosis: refused before any work when absent, and the candidate overlaid
on it (``pip --target`` + PYTHONPATH) and proven to be the miniverl it imports."""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest

from harness.core.errors import HarnessError, InstallError, UsageError
from harness.install.verl_env import MISSING, VerlEnv, child_env, observed, prepare, prove, require_verl


def fake_verl_python(root: Path, *, version: str | None = "0.9.1", own_miniverl: str | None = None,
                     order: str = "after") -> Path:  # fmt: skip
    """A ``--verl-python`` like the H200's: a wrapper script over this interpreter that adds a ``pip --target``
    directory (a stand-in ``verl`` package, optionally its own ``miniverl``) to PYTHONPATH. ``order``: ``after``
    keeps the PYTHONPATH it is given in front (the documented way), ``before`` puts its own directory first,
    ``replace`` drops the given PYTHONPATH."""
    site = root / "target"
    if version is not None:
        (site / "verl").mkdir(parents=True)
        (site / "verl" / "__init__.py").write_text(f'print("verl banner on stdout")\n__version__ = "{version}"\n')
    if own_miniverl is not None:
        (site / "miniverl").mkdir(parents=True)
        (site / "miniverl" / "__init__.py").write_text(f'__version__ = "{own_miniverl}"\n')
    site.mkdir(parents=True, exist_ok=True)
    path = {
        "after": f'"${{PYTHONPATH:+$PYTHONPATH:}}{site}"',
        "before": f'"{site}${{PYTHONPATH:+:$PYTHONPATH}}"',
        "replace": f'"{site}"',
    }[order]
    wrapper = root / "bin" / "python"
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={path} exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def _wheel(candidate: Path) -> tuple[Path, str, str]:
    manifest = json.loads((candidate / "candidate-manifest.json").read_bytes())
    return candidate / manifest["wheel"]["filename"], manifest["wheel"]["sha256"], manifest["version"]


def _prepare(candidate: Path, python: Path, work: Path) -> VerlEnv:
    wheel, sha, version = _wheel(candidate)
    work.mkdir(parents=True, exist_ok=True)
    return prepare(python, Path(sys.executable), wheel, sha, version, work=work)


# ------------------------------------------------------------------------------------------ the pre-flight


def test_no_verl_python_is_one_usage_line_naming_what_to_run() -> None:
    with pytest.raises(UsageError) as err:
        require_verl(None)
    assert err.value.check == "verl_python" and err.value.exit_code == 2
    assert "make verl-env" in str(err.value) and "--verl-python" in str(err.value)


@pytest.mark.parametrize(("version", "says"), [(None, "ModuleNotFoundError"), ("0.9.0", "verl 0.9.0, not verl 0.9.1")])
def test_an_environment_without_verl_0_9_1_is_refused(tmp_path: Path, version: str | None, says: str) -> None:
    with pytest.raises(UsageError) as err:
        require_verl(fake_verl_python(tmp_path, version=version))
    assert err.value.check == "verl_python" and says in str(err.value) and MISSING in str(err.value)


def test_verl_0_9_1_passes_the_pre_flight(tmp_path: Path) -> None:
    assert require_verl(fake_verl_python(tmp_path)) == "0.9.1"


# ------------------------------------------------------------------------------------------ the overlay


def test_the_candidate_overlay_is_the_miniverl_verl_imports(candidate: Path, tmp_path: Path) -> None:
    """Even where the interpreter has another miniverl of its own (here the wrapper's target holds 9.9.9, and the
    test interpreter may hold an editable checkout), the overlay comes first and is proven so."""
    python = fake_verl_python(tmp_path / "verl", own_miniverl="9.9.9")
    env = _prepare(candidate, python, tmp_path / "work")
    assert env.overlay == tmp_path / "work" / "verl-overlay"
    assert (env.verl_version, env.miniverl_version) == ("0.9.1", _wheel(candidate)[2])
    assert env.facts() == {
        "verl_version": "0.9.1",
        "miniverl_version": _wheel(candidate)[2],
        "miniverl_file": "<verl-overlay>/miniverl/__init__.py",
    }
    assert not list(env.overlay.rglob("*.pyc"))  # nothing compiled for the installer's interpreter


@pytest.mark.parametrize("order", ["before", "replace"])
def test_a_wrapper_that_does_not_keep_the_overlay_first_is_refused(candidate: Path, tmp_path: Path, order: str) -> None:
    python = fake_verl_python(tmp_path / "verl", own_miniverl="9.9.9", order=order)
    with pytest.raises(HarnessError) as err:
        _prepare(candidate, python, tmp_path / "work")
    assert err.value.check == "verl_environment" and "not from the candidate overlay" in str(err.value)


def test_a_wrong_verl_behind_the_overlay_is_refused(candidate: Path, tmp_path: Path) -> None:
    with pytest.raises(HarnessError) as err:
        _prepare(candidate, fake_verl_python(tmp_path / "verl", version="0.8.0"), tmp_path / "work")
    assert err.value.check == "verl_environment" and "verl 0.8.0" in str(err.value)


def test_a_candidate_of_another_version_is_refused(candidate: Path, tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    env = _prepare(candidate, fake_verl_python(tmp_path / "verl"), tmp_path / "work")
    with pytest.raises(HarnessError) as err:
        prove(env.python, env.overlay, "9.9.9", cwd=tmp_path)
    assert "the candidate is 9.9.9" in str(err.value)


def test_a_wheel_whose_bytes_differ_is_never_installed(candidate: Path, tmp_path: Path) -> None:
    wheel, _, version = _wheel(candidate)
    copy = tmp_path / wheel.name
    shutil.copyfile(wheel, copy)
    with pytest.raises(InstallError) as err:
        prepare(fake_verl_python(tmp_path / "verl"), Path(sys.executable), copy, "0" * 64, version, work=tmp_path)
    assert err.value.check == "verl_environment" and not (tmp_path / "verl-overlay").exists()


def test_the_workloads_run_verls_python_with_the_overlay(candidate: Path, tmp_path: Path) -> None:
    """``run_module`` (every ``<verl-python> -m miniverl``) and the evidence of which miniverl diagnosed."""
    from harness.core.proc import Redactor
    from harness.core.profiles import PROFILES
    from harness.qualify.full import walkthrough
    from harness.qualify.full.base import Context
    from harness.qualify.full.scales import SCALES
    from harness.qualify.transcript import CliDriver

    python = fake_verl_python(tmp_path / "verl", own_miniverl="9.9.9")
    env = _prepare(candidate, python, tmp_path / "work")
    (env.overlay / "miniverl" / "__main__.py").write_text("import miniverl, sys; print(miniverl.__file__, sys.argv)\n")
    work = tmp_path / "cli"
    (work / "miniverl").mkdir(parents=True)  # a miniverl/ in the working directory never shadows the overlay
    ctx = Context(
        cli=CliDriver(venv=tmp_path / "venv", work=work, redact=Redactor({"work": work}), installed=None, extra_env={}),
        work=work,
        profile=PROFILES["cpu-reference"],
        scale=SCALES["cpu-reference"],
        data="data/prompts.parquet",
        model_wheel=None,
        verl_python=python,
        verl_overlay=env.overlay,
    )
    result = walkthrough.run_module(ctx, "diagnose", python, ["diagnose", "bundle"])
    assert result.invocation.exit_code == 0, result.stderr
    assert result.stdout.decode().startswith(str(env.overlay / "miniverl" / "__init__.py"))
    facts = walkthrough.diagnose_environment(ctx)
    assert facts["verl_python"] == "<verl-venv>/bin/python"
    assert facts["verl_overlay"] == "<verl-overlay>"
    assert facts["miniverl_file"] == "<verl-overlay>/miniverl/__init__.py"
    assert (facts["verl_version"], facts["miniverl_version"]) == ("0.9.1", env.miniverl_version)
    assert "probe_error" not in facts and str(tmp_path) not in json.dumps(facts)


def test_without_an_overlay_the_evidence_says_which_miniverl_ran(tmp_path: Path) -> None:
    facts = observed(fake_verl_python(tmp_path, own_miniverl="9.9.9"), None, cwd=tmp_path)
    assert facts["verl_overlay"] is None and facts["miniverl_version"] == "9.9.9"
    assert facts["miniverl_file"] is not None and not facts["miniverl_file"].startswith("<verl-overlay>")
    assert child_env(None) == {"PYTHONSAFEPATH": "1"}


# ------------------------------------------------------------------------------------------ the CLI


def _full(out: Path, repo: Path, known_good: Path, *extra: str) -> list[str]:
    return ["full", "--profile", "cpu-reference", "--out", str(out), "--repo", str(repo),
            "--known-good-dir", str(known_good), *extra]  # fmt: skip


def test_full_without_verl_python_stops_before_any_work(
    fake_repo: Path, known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness_helpers import copy_tree

    from harness.cli import main

    repo = copy_tree(fake_repo, tmp_path / "repo")
    assert main(_full(tmp_path / "q", repo, known_good, "--work", str(tmp_path / "work"))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"harness: error: [verl_python] {MISSING}"]
    # nothing built (no candidate under the checkout's out/), installed (no work dir) or written (no --out)
    assert not (repo / "out").exists() and not (tmp_path / "work").exists() and not (tmp_path / "q").exists()


@pytest.mark.parametrize("kind", ["no_verl", "not_a_file"])
def test_full_with_a_verl_python_that_lacks_verl_stops_before_any_work(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    from harness.cli import main

    python = fake_verl_python(tmp_path / "verl", version=None) if kind == "no_verl" else tmp_path / "nothing"
    argv = _full(tmp_path / "q", fake_repo, known_good, "--candidate", str(candidate), "--work", str(tmp_path / "w"))
    assert main([*argv, "--verl-python", str(python)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("harness: error: [verl_python] --verl-python"), err
    assert "make verl-env" in err[0]
    assert not (tmp_path / "q").exists() and not (tmp_path / "w").exists()


def test_the_workload_probe_overlays_only_with_a_wheel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m harness workload --verl-python`` needs the candidate wheel to overlay (else one line, exit 2)."""
    from harness.cli import main

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "miniverl").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "prompts.parquet").write_bytes(b"PAR1")
    argv = ["workload", "ppo-rm-handoff", "--profile", "cpu-reference", "--venv", str(venv), "--data",
            str(tmp_path / "prompts.parquet"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "out"),
            "--verl-python", str(fake_verl_python(tmp_path / "verl"))]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--verl-python needs --wheel" in err[0], err
    assert not (tmp_path / "w").exists() and not (tmp_path / "out").exists()
