"""Crash consistency, one test per promise: the checkpoint is the commit point of its step's metrics and
trajectories; a run killed before its first checkpoint resumes from step 0; a hand-edited ``checkpoint.json`` is
refused; SIGTERM stops a run as SIGINT does. (The kill-at-random-points test is ``test_crash_kills.py``.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
PLUGIN = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]


def _plan(cli, write_config, tiny_model_dir: Path, cycles: int = 2) -> None:
    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = PLUGIN
    config["train"]["cycles"] = cycles
    write_config(config)
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert result.code == 0, result.err


def _resume(cli, run_id: str):
    return cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", run_id, "--resume", "--json")


def _one_line(result, code: int, *needles: str) -> None:
    assert result.code == code, (result.code, result.err)
    assert result.err.count("\n") == 1 and "Traceback" not in result.err, result.err
    for needle in needles:
        assert needle in result.err, result.err


def _untimed(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.endswith("_seconds")} for x in lines]


def test_final_checkpoint_commits_metrics_and_trajectories(
    cli, write_config, tiny_model_dir, prompts, workdir: Path
) -> None:
    """Killed right after the final checkpoint: metrics.jsonl already holds every line that checkpoint binds, and
    resume rolls back what a later (uncommitted) update wrote and refuses a changed committed trajectory."""
    from miniverl.canonical import sha256_file
    from miniverl.training import checkpoint
    from miniverl.training.entry import run_from_plan

    _plan(cli, write_config, tiny_model_dir)

    class Kill(BaseException):
        pass

    original = checkpoint.write_checkpoint

    def write_then_die(*args, **kwargs):
        path = original(*args, **kwargs)
        if args[1].step == 2:
            raise Kill
        return path

    checkpoint.write_checkpoint = write_then_die
    try:
        with pytest.raises(Kill):
            run_from_plan(Path("plan.json"), output=Path("runs"), run_id="cut")
    finally:
        checkpoint.write_checkpoint = original
    run_dir = workdir / "runs/cut"
    record = json.loads((run_dir / "checkpoints/step-000002/checkpoint.json").read_text())
    assert record["metrics_lines"] == 2 and len(_untimed(run_dir)) == 2  # durable before the checkpoint
    for name, digest in record["trajectories"].items():
        assert sha256_file(run_dir / "trajectories" / name) == digest
    assert not (run_dir / "summary.json").exists()
    committed = _untimed(run_dir)
    # what an uncommitted later update could leave behind: one more metrics line and trajectory file
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write((run_dir / "metrics.jsonl").read_text().splitlines()[-1] + "\n")
    (run_dir / "trajectories/cycle-000003.jsonl").write_text("{}\n")
    (run_dir / "trajectories/.cycle-000003.jsonl.x.tmp").write_text("")
    resumed = _resume(cli, "cut")
    assert resumed.code == 0, resumed.err
    summary = resumed.json()["summary"]
    assert summary["updates"] == 2 and summary["cycles"] == 2 and summary["resumed_from_step"] == 2
    assert _untimed(run_dir) == committed
    assert sorted(p.name for p in (run_dir / "trajectories").iterdir()) == ["cycle-000001.jsonl", "cycle-000002.jsonl"]

    # a committed trajectory file that changed cannot be vouched for: refused, nothing rewritten
    shutil.rmtree(run_dir / "checkpoints/step-000002")  # resume from step 1, which binds cycle-000001
    (run_dir / "summary.json").unlink()
    (run_dir / "trajectories/cycle-000001.jsonl").write_text("{}\n")
    _one_line(_resume(cli, "cut"), 1, "trajectories/cycle-000001.jsonl", "step-000001")


def test_killed_before_the_first_checkpoint_restarts_from_step_zero(
    cli, write_config, tiny_model_dir, prompts, workdir: Path
) -> None:
    from miniverl.training.entry import run_from_plan

    _plan(cli, write_config, tiny_model_dir)
    straight = cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", "straight", "--json")
    assert straight.code == 0, straight.err

    class Stop(Exception):
        pass

    def stop(name: str, step: int) -> None:
        if (name, step) == ("update", 0):
            raise Stop

    # an exception (or SIGINT/SIGTERM) before the first checkpoint cleans the run up: a plain re-run works
    with pytest.raises(Stop):
        run_from_plan(Path("plan.json"), output=Path("runs"), run_id="early", on_phase=stop)
    assert not (workdir / "runs/early").exists()

    # what SIGKILL leaves (no cleanup ran): plan.json, run.json, an uncommitted step's outputs, a temp checkpoint
    cut = workdir / "runs/cut"
    (cut / "trajectories").mkdir(parents=True)
    for name in ("plan.json", "run.json"):
        shutil.copy(workdir / "runs/straight" / name, cut / name)
    (cut / "metrics.jsonl").write_text("{}\n")
    (cut / "trajectories/cycle-000001.jsonl").write_text("{}\n")
    (cut / "checkpoints/.tmp-step-000001").mkdir(parents=True)
    plain = cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", "cut")
    _one_line(plain, 2, "already exists", "--resume")
    resumed = _resume(cli, "cut")
    assert resumed.code == 0, resumed.err
    assert resumed.json()["summary"]["resumed_from_step"] is None and resumed.json()["updates"] == 2
    assert _untimed(cut) == _untimed(workdir / "runs/straight")
    for name in ("cycle-000001.jsonl", "cycle-000002.jsonl"):
        reference = workdir / "runs/straight/trajectories" / name
        assert (cut / "trajectories" / name).read_bytes() == reference.read_bytes()

    # killed during the model load: an empty run directory
    (workdir / "runs/empty").mkdir()
    assert _resume(cli, "empty").code == 0

    # never remove what is not ours, nor another plan's run
    (workdir / "runs/foreign").mkdir()
    (workdir / "runs/foreign/notes.txt").write_text("mine")
    _one_line(_resume(cli, "foreign"), 2, "notes.txt")
    assert (workdir / "runs/foreign/notes.txt").read_text() == "mine"
    other = workdir / "runs/other"
    other.mkdir()
    manifest = json.loads((workdir / "runs/straight/run.json").read_text())
    (other / "run.json").write_text(json.dumps({**manifest, "plan_digest": "0" * 64}))
    _one_line(_resume(cli, "other"), 2, "--run-id")
    assert (other / "run.json").is_file()


@pytest.mark.parametrize("edit", ["step", "renamed", "metrics_lines", "trajectories"])
def test_hand_edited_checkpoint_json_is_refused(
    cli, write_config, tiny_model_dir, prompts, workdir: Path, edit: str
) -> None:
    _plan(cli, write_config, tiny_model_dir)
    assert cli("run", "--plan", "plan.json", "--output", "runs", "--run-id", "e").code == 0
    last = workdir / "runs/e/checkpoints/step-000002"
    record = json.loads((last / "checkpoint.json").read_text())
    if edit == "step":
        record["step"] = 3
    elif edit == "renamed":  # a consistent-looking step 3 in a directory named for it
        record["step"] = 3
        last = last.rename(last.parent / "step-000003")
    elif edit == "metrics_lines":
        record["metrics_lines"] = 1
    else:
        del record["trajectories"]["cycle-000002.jsonl"]
    (last / "checkpoint.json").write_text(json.dumps(record, indent=2))
    _one_line(_resume(cli, "e"), 1, f"checkpoint {last.name} is invalid")
    inspected = cli("inspect", str(workdir / "runs/e"), "--json").json()
    state = {c["name"]: c for c in inspected["checkpoints"]}[last.name]
    assert state["state"] == "corrupt" and "invalid" in state["reason"]
    assert inspected["last_complete_step"] == 1
    export = cli("export", str(workdir / "runs/e"), "--out", "adapter")
    _one_line(export, 1, "invalid")


def _start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "CI": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "miniverl", *args], cwd=cwd, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_sigterm_stops_like_sigint(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    """SIGTERM after the first checkpoint: exit 130 (SIGINT's), one line, no temp file; --resume finishes.
    SIGTERM before the first checkpoint: the run directory is removed, so the same run id starts again."""
    _plan(cli, write_config, tiny_model_dir, cycles=6)
    run = ["run", "--plan", "plan.json", "--output", "runs", "--json", "--threads", "1", "--run-id"]
    late = _start([*run, "late"], workdir)
    _wait_for(workdir / "runs/late/checkpoints/step-000001", late)
    late.send_signal(signal.SIGTERM)
    out, err = late.communicate(timeout=120)
    assert late.returncode == 130, err
    resume = "miniverl run --plan plan.json --output runs --run-id late --threads 1 --resume"
    assert err == f"miniverl: interrupted; the run continues from its last complete checkpoint with `{resume}`\n"
    assert out == ""
    run_dir = workdir / "runs/late"
    assert not [p for p in run_dir.rglob("*") if p.name.startswith(".tmp") or p.name.endswith(".tmp")]
    assert not (run_dir / "summary.json").exists()
    steps = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    last = json.loads((run_dir / "checkpoints" / steps[-1] / "checkpoint.json").read_text())
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) in (last["step"], last["step"] + 1)
    resumed = _resume(cli, "late")
    assert resumed.code == 0, resumed.err
    assert resumed.json()["summary"]["resumed_from_step"] == last["step"] and resumed.json()["updates"] == 6

    early = _start([*run, "early"], workdir)
    _wait_for(workdir / "runs/early", early)  # created once the handler is in place, before the model loads
    early.send_signal(signal.SIGTERM)
    out, err = early.communicate(timeout=120)
    again = "miniverl run --plan plan.json --output runs --run-id early --threads 1"
    assert (
        early.returncode == 130
        and err == f"miniverl: interrupted before the first checkpoint; start again with `{again}`\n"
    )
    assert not (workdir / "runs/early").exists()
