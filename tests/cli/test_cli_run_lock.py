"""One writer per run directory, idempotent ``--extend`` and verified resume state (issue #20).

Races are real: the second writer is another process (``python -m miniverl``), started while the first one,
in this process, holds the run directory (from a cycle hook). The loser exits 2 with one line naming the
holder's pid, and the winner's directory ends as an uninterrupted run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult, tiny_config

REPO = Path(__file__).resolve().parents[2]
TIMINGS = {"rollout_seconds", "update_seconds", "cycle_seconds"}


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(t) for t in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in lines]


def _miniverl(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "miniverl", *argv], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def _one_line_exit_2(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
    assert result.stderr.startswith("miniverl: error: ") and "Traceback" not in result.stderr


@pytest.fixture()
def plans(
    workdir: Path, prompts: Path, tiny_model_dir: Path, write_config: Callable[..., Path], one_torch_thread: None,
    cli: Callable[..., CliResult],
) -> Path:  # fmt: skip
    write_config(tiny_config(tiny_model_dir, checkpoint={"every_updates": 1, "keep_last": 1}))
    assert cli("plan", "config.yaml", "--out", "two.json", "--set", "train.cycles=2", "-q").code == 0
    assert cli("plan", "config.yaml", "--out", "three.json", "--set", "train.cycles=3", "-q").code == 0
    assert cli("plan", "config.yaml", "--out", "four.json", "--set", "train.cycles=4", "-q").code == 0
    return workdir


def _during(name: str, index: int, action: Callable[[], None]) -> Callable[[str, int], None]:
    def on_phase(phase: str, at: int) -> None:
        if (phase, at) == (name, index):
            action()

    return on_phase


def test_second_writer_exits_2_while_a_run_holds_the_directory(plans: Path, cli: Callable[..., CliResult]) -> None:
    from miniverl.training.entry import run_from_plan

    once = cli("run", "--plan", "two.json", "--run-id", "once", "--threads", "1", "-q")
    assert once.code == 0, once.err
    losers: dict[str, subprocess.CompletedProcess[str]] = {}

    def race() -> None:  # the run is loading or has just loaded: no checkpoint yet
        base = ("run", "--run-id", "r", "--threads", "1", "-q")
        losers["fresh"] = _miniverl(*base, "--plan", "two.json")
        losers["resume"] = _miniverl(*base, "--plan", "two.json", "--resume")
        losers["other_plan"] = _miniverl(*base, "--plan", "three.json", "--resume")
        losers["extend"] = _miniverl(*base, "--plan", "two.json", "--resume", "--extend", "1")
        losers["report"] = _miniverl("report", "runs/r", "-q")

    def race_later() -> None:  # resume during training, with a checkpoint on disk
        losers["resume_training"] = _miniverl("run", "--run-id", "r", "--plan", "two.json", "--resume", "-q")

    hooks = {("rollout", 0): race, ("update", 1): race_later}
    run_from_plan(
        Path("two.json"),
        output=Path("runs"),
        run_id="r",
        on_phase=lambda name, at: hooks.get((name, at), lambda: None)(),
    )
    _one_line_exit_2(losers["fresh"], "already exists")
    for name in ("resume", "other_plan", "extend", "resume_training"):
        _one_line_exit_2(losers[name], f"being written by pid {os.getpid()}")
    # report of a running run is a read-only snapshot without the lock (issue #37); inspect is a reader too
    assert losers["report"].returncode == 0 and losers["report"].stderr == "", losers["report"].stderr
    run_dir = plans / "runs" / "r"
    assert _metrics(run_dir) == _metrics(plans / "runs" / "once")
    assert json.loads((run_dir / "summary.json").read_text())["updates"] == 2
    assert (run_dir / "plan.json").read_bytes() == Path("two.json").read_bytes()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002"]
    assert (run_dir / ".lock").read_text() == ""  # released: no pid left behind
    assert cli("inspect", str(run_dir), "-q").code == 0


def test_two_fresh_runs_at_once_exactly_one_wins(plans: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "miniverl", "run", "--plan", "two.json", "--run-id", "same", "--threads", "1", "-q"]
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read() if p.stderr else "") for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert loser.count("\n") == 1 and loser.startswith("miniverl: error: "), loser
    assert "already exists" in loser or "being written by" in loser, loser
    assert json.loads((plans / "runs" / "same" / "summary.json").read_text())["updates"] == 2


def test_a_second_extend_during_an_extension_exits_2(plans: Path, cli: Callable[..., CliResult]) -> None:
    from miniverl.training.entry import run_from_plan

    for run_id, plan in (("three", "three.json"), ("ext", "two.json")):
        assert cli("run", "--plan", plan, "--run-id", run_id, "--threads", "1", "-q").code == 0
    losers: list[subprocess.CompletedProcess[str]] = []

    def race() -> None:
        losers.append(_miniverl("run", "--run-id", "ext", "--plan", "two.json", "--resume", "--extend", "1", "-q"))

    run_from_plan(
        Path("two.json"), output=Path("runs"), run_id="ext", resume=True, extend=1, on_phase=_during("score", 2, race)
    )
    _one_line_exit_2(losers[0], f"being written by pid {os.getpid()}")
    ext = plans / "runs" / "ext"
    assert _metrics(ext) == _metrics(plans / "runs" / "three")  # extended once: 3 cycles, not 4
    assert not (ext / "extension.json").exists()


class _Killed(Exception):
    pass


def _kill_at(name: str, index: int) -> Callable[[str, int], None]:
    def kill() -> None:
        raise _Killed

    return _during(name, index, kill)


def test_killed_extension_retried_adds_exactly_n(plans: Path, cli: Callable[..., CliResult]) -> None:
    from miniverl.training.entry import run_from_plan

    for run_id, plan in (("four", "four.json"), ("ext", "two.json")):
        assert cli("run", "--plan", plan, "--run-id", run_id, "--threads", "1", "-q").code == 0
    ext = plans / "runs" / "ext"
    # killed after the first added cycle's checkpoint: plan.json already records 4 cycles
    with pytest.raises(_Killed):
        run_from_plan(
            Path("two.json"), output=Path("runs"), run_id="ext", resume=True, extend=2, on_phase=_kill_at("rollout", 3)
        )
    target = json.loads((ext / "extension.json").read_text())
    assert (target["from_cycles"], target["to_cycles"], target["added_cycles"]) == (2, 4, 2)
    # another N on the unfinished extension is refused, naming its target; nothing changes
    before = {p: p.read_bytes() for p in sorted(ext.rglob("*")) if p.is_file()}
    for plan in ("two.json", str(ext / "plan.json")):
        other = cli("run", "--plan", plan, "--run-id", "ext", "--resume", "--extend", "1", "-q")
        assert other.code == 2 and other.err.count("\n") == 1, other.err
        assert "unfinished extension from 2 to 4 cycles" in other.err and "--extend 2" in other.err, other.err
    assert {p: p.read_bytes() for p in sorted(ext.rglob("*")) if p.is_file()} == before
    # the retry the error message advises: the same command completes the same target
    retry = cli("run", "--plan", "two.json", "--run-id", "ext", "--resume", "--extend", "2", "--json")
    assert retry.code == 0, retry.err
    assert retry.json()["updates"] == 4
    assert _metrics(ext) == _metrics(plans / "runs" / "four")
    assert json.loads((ext / "plan.json").read_text())["cycles"] == 4
    assert not (ext / "extension.json").exists()
    # and a later --extend is a new extension again
    again = cli("run", "--plan", str(ext / "plan.json"), "--run-id", "ext", "--resume", "--extend", "1", "--json")
    assert again.code == 0 and again.json()["updates"] == 5, again.err


def test_killed_extension_before_plan_written_retry(
    plans: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill between the durable target and plan.json's replacement: the retry writes the same plan."""
    from miniverl.artifacts.rundir import lifecycle
    from miniverl.training import entry

    assert cli("run", "--plan", "two.json", "--run-id", "ext", "--threads", "1", "-q").code == 0
    ext = plans / "runs" / "ext"
    original = lifecycle.atomic_write_json

    def die_on_plan(path: Any, value: Any, **kwargs: Any) -> None:
        if Path(path).name == "plan.json":
            raise _Killed
        original(path, value, **kwargs)

    with monkeypatch.context() as patch, pytest.raises(_Killed):
        patch.setattr(lifecycle, "atomic_write_json", die_on_plan)
        entry.run_from_plan(Path("two.json"), output=Path("runs"), run_id="ext", resume=True, extend=1)
    assert json.loads((ext / "plan.json").read_text())["cycles"] == 2
    assert json.loads((ext / "extension.json").read_text())["to_cycles"] == 3
    retry = cli("run", "--plan", "two.json", "--run-id", "ext", "--resume", "--extend", "1", "--json")
    assert retry.code == 0 and retry.json()["updates"] == 3, retry.err
    assert not (ext / "extension.json").exists()


def test_resume_verifies_and_restores_run_records(plans: Path, cli: Callable[..., CliResult]) -> None:
    assert cli("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "-q").code == 0
    run_dir = plans / "runs" / "r"
    record_path = run_dir / "checkpoints" / "step-000002" / "checkpoint.json"
    record_text = record_path.read_text()
    resume = ("run", "--plan", "two.json", "--run-id", "r", "--resume", "--threads", "1", "-q")

    # an edited data_cursor is refused (exit 2), on a completed run and on one that would train
    record = json.loads(record_text)
    record["data_cursor"] = 3
    record_path.write_text(json.dumps(record))
    before = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    for argv in (resume, (*resume, "--extend", "1")):
        result = cli(*argv)
        assert result.code == 2 and result.err.count("\n") == 1 and "data_cursor is 3" in result.err, result.err
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == before
    record_path.write_text(record_text)

    # a deleted plan.json is restored from --plan (a completed run: no training needed)
    plan_bytes = (run_dir / "plan.json").read_bytes()
    (run_dir / "plan.json").unlink()
    assert cli(*resume).code == 0
    assert (run_dir / "plan.json").read_bytes() == plan_bytes

    # a plan.json of another plan is refused, not trusted
    (run_dir / "plan.json").write_bytes(Path("three.json").read_bytes())
    other = cli(*resume)
    assert other.code == 2 and other.err.count("\n") == 1 and "not the resumed plan" in other.err, other.err
    (run_dir / "plan.json").write_bytes(plan_bytes)

    # a deleted run.json is rebuilt, byte for byte
    manifest = (run_dir / "run.json").read_bytes()
    (run_dir / "run.json").unlink()
    assert cli(*resume).code == 0
    assert (run_dir / "run.json").read_bytes() == manifest

    # an edited run.json (another run) is refused
    edited = json.loads(manifest)
    edited["run_id"] = "someone-else"
    (run_dir / "run.json").write_text(json.dumps(edited))
    refused = cli(*resume[:-1], "--extend", "1", "-q")
    assert refused.code == 2 and "run.json" in refused.err and refused.err.count("\n") == 1, refused.err


def test_resume_of_a_completed_run_finishes_its_prune(
    plans: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    from miniverl.training import controller

    with monkeypatch.context() as patch:  # a kill between the final checkpoint and its prune
        patch.setattr(controller, "prune_checkpoints", lambda root, keep: [])
        assert cli("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "-q").code == 0
    steps = plans / "runs" / "r" / "checkpoints"
    assert sorted(p.name for p in steps.iterdir()) == ["step-000001", "step-000002"]
    result = cli("run", "--plan", "two.json", "--run-id", "r", "--resume", "--json")
    assert result.code == 0 and result.json()["resumed"] is False, result.err
    assert sorted(p.name for p in steps.iterdir()) == ["step-000002"]


def test_fresh_run_that_loses_the_lock_after_its_mkdir_leaves_the_directory(
    plans: Path, cli: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --resume may lock the directory a fresh run has just created: the fresh run stops, deleting nothing."""
    import fcntl

    from miniverl.artifacts import runlock

    original = runlock.acquire
    held: list[int] = []

    def resume_gets_there_first(run_dir: Path, *, what: str) -> bool:
        fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        held.append(fd)
        (run_dir / "metrics.jsonl").write_text("")  # the other writer's work in progress
        return original(run_dir, what=what)

    monkeypatch.setattr(runlock, "acquire", resume_gets_there_first)
    try:
        result = cli("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "-q")
    finally:
        for fd in held:
            os.close(fd)
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert f"being written by pid {os.getpid()}" in result.err, result.err
    assert (plans / "runs" / "r" / "metrics.jsonl").is_file()
