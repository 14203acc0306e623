"""``harness full --vllm-site DIR``: the CLI processes see the site after the venv's own site, and the qualification
records the harness's digest of the site's files.

The CPU test drives the real ``miniverl`` CLI (this checkout's, behind a stand-in venv whose interpreter is the
test's) with a stand-in site holding a fake ``vllm`` package and a ``pydantic`` that refuses to import: the plan
probe finds ``vllm`` and accepts ``rollout.backend: vllm`` (so the site is on the path), runs on the venv's pydantic
(so the site is after the venv's site), and the run fails in one line, which the judge fails, never passes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.core.errors import UsageError
from harness.core.proc import REPO_ROOT, Redactor, clean_env, run
from harness.core.profiles import PROFILES
from harness.install.vllm_site import python_path, read_site
from harness.qualify.full import refresh
from harness.qualify.full.base import Context, Judgement
from harness.qualify.full.scales import SCALES
from harness.qualify.transcript import CliDriver

FIXTURES = Path(__file__).resolve().parent / "full_fixtures" / "backend-matrix"
SHADOW = "the stand-in vLLM site shadowed the venv's pydantic"


def _site(root: Path) -> Path:
    site = root / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.0.0+fake"\n')
    (site / "vllm-0.0.0+fake.dist-info").mkdir()
    (site / "vllm-0.0.0+fake.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.0.0+fake\n")
    (site / "pydantic").mkdir()
    (site / "pydantic" / "__init__.py").write_text(f"raise ImportError({SHADOW!r})\n")
    return site


def _venv(root: Path) -> Path:
    """A stand-in venv: its python is the test's interpreter, its miniverl this checkout's CLI."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    entry = (
        f"import sys; sys.path.insert(1, {str(REPO_ROOT)!r}); sys.argv[0] = 'miniverl'; "
        "from miniverl.cli import entry; entry()"
    )
    cli = venv / "bin" / "miniverl"
    cli.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{entry}" "$@"\n')
    for script in (python, cli):
        script.chmod(0o755)
    return venv


def test_the_site_digest_is_the_harness_s_own_of_every_file(tmp_path: Path) -> None:
    site = _site(tmp_path)
    first = read_site(site)
    assert first.files == 3 and first.version == "0.0.0+fake" and len(first.sha256) == 64
    assert set(first.facts()) == {"vllm_site_sha256", "vllm_site_files", "vllm_site_bytes", "vllm_site_version"}
    (site / "vllm" / "__pycache__").mkdir()
    (site / "vllm" / "__pycache__" / "__init__.cpython-312.pyc").write_bytes(b"derived")
    assert read_site(site) == first  # bytecode written by an import is not the site's content
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.0.1"\n')
    assert read_site(site).sha256 != first.sha256
    (site / "vllm" / "extra.py").write_text("")
    assert read_site(site).files == 4


@pytest.mark.parametrize("case", ["missing", "a file", "no vllm", "a symlink"])
def test_a_bad_site_is_refused_in_one_line(case: str, tmp_path: Path) -> None:
    site = _site(tmp_path)
    if case == "missing":
        site = tmp_path / "nowhere"
    elif case == "a file":
        site = site / "vllm" / "__init__.py"
    elif case == "no vllm":
        shutil.rmtree(site / "vllm")
    else:
        (site / "vllm" / "link.py").symlink_to(site / "vllm" / "__init__.py")
    with pytest.raises(UsageError) as caught:
        read_site(site)
    assert "\n" not in str(caught.value) and "--vllm-site" in str(caught.value)


def test_harness_full_refuses_a_bad_site_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verl = tmp_path / "python"
    verl.write_text("")
    out = tmp_path / "out"
    argv = ["full", "--profile", "cpu-reference", "--out", str(out), "--verl-python", str(verl)]
    assert main([*argv, "--vllm-site", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vllm-site" in err[0] and "is not a directory" in err[0], err
    assert not out.exists()


def test_the_site_comes_after_the_venv_s_own_site(tmp_path: Path) -> None:
    """With the site after the venv's site, pydantic is the venv's and vllm the site's; first (vllm.sh smoke's
    order, right for the image's bare python but not for a qualified closure) the site would shadow the venv."""
    site, venv = _site(tmp_path), _venv(tmp_path)
    path = python_path(venv / "bin" / "python", site, work=tmp_path)
    assert path.split(":")[-1] == str(site) and path.count(str(site)) == 1
    code = "import pydantic, vllm; print(vllm.__version__, pydantic.__file__)"
    after = run([venv / "bin" / "python", "-c", code], cwd=tmp_path, env=clean_env({"PYTHONPATH": path}))
    assert after.returncode == 0, after.stderr
    version, pydantic_file = after.stdout.decode().split()
    assert version == "0.0.0+fake" and not pydantic_file.startswith(str(site))
    first = f"{site}:{path}"
    before = run([venv / "bin" / "python", "-c", code], cwd=tmp_path, env=clean_env({"PYTHONPATH": first}))
    assert before.returncode != 0 and SHADOW in before.stderr.decode()


def test_a_fake_vllm_on_the_site_is_accepted_by_plan_then_fails_the_judge(tmp_path: Path) -> None:
    """The real plan probe and run behind a stand-in site (one cycle: all a failing run needs); the judge fails the
    boundary and the refresh chain on that evidence (the fast and hf chains are the captured CPU ones)."""
    site, venv = _site(tmp_path), _venv(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PYTHONPATH": python_path(venv / "bin" / "python", site, work=work), "OMP_NUM_THREADS": "1"}
    cli = CliDriver(venv=venv, work=work, redact=Redactor({"work": work}), installed=None, extra_env=env)
    assert cli("init", ["init", "project", "--example", "grpo"]).ok
    (work / "data").mkdir()
    shutil.copyfile(work / "project" / "prompts.parquet", work / "data" / "prompts.parquet")
    shutil.copyfile(refresh.WORKLOADS / refresh.YAML, work / refresh.YAML)
    profile, scale = PROFILES["cpu-reference"], SCALES["cpu-reference"]
    ctx = Context(cli, work, profile, scale, data="data/prompts.parquet", model_wheel=None, verl_python=None)
    found = refresh.run_vllm(ctx, 1)
    probe = json.loads(found["refresh_vllm_plan"].read_text())
    assert probe["exit_code"] == 0 and probe["plan_written"] is True, probe  # vllm found, pydantic the venv's
    (ran,) = [r for r in cli.results if r.invocation.step == "refresh_vllm_run"]
    stderr = [line for line in ran.stderr.decode().splitlines() if line.strip()]
    assert ran.invocation.exit_code != 0 and len(stderr) == 1 and stderr[0].startswith("miniverl: "), stderr
    evidence = {r: FIXTURES / m for r, m in refresh.REFRESH_EVIDENCE.items() if not r.startswith("refresh_vllm_")}
    evidence.update(found)
    judgement = Judgement()
    refresh.judge_refreshes(evidence, judgement, profile, scale)
    failed = sorted(name for name, (ok, _) in judgement.checks.items() if not ok)
    assert failed == ["grouped_trajectory_identity", "policy_refreshes", "vllm_boundary"], judgement.checks
    assert "vllm_boundary" not in judgement.inapplicable and judgement.metrics["vllm_backend"] == "failed"
    assert "no readable summary.json" in judgement.checks["vllm_boundary"][1]
