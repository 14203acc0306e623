"""Kill a real training process at seeded random times and at named points, resume, compare with a straight run.

The test starts one driver subprocess (this file run as a script). The driver imports torch and miniverl once,
then forks one child per run: the uninterrupted reference, and for each kill a child that dies (SIGKILL from the
driver at a seeded random time, or ``os._exit`` at a named point) and a child that resumes it through the CLI.
Forking keeps 20+ kills cheap (no re-import per process). The driver compares files only (no torch compute in
the forking parent): every tensor of the last checkpoint (adapter, AdamW, RNG) by ``safetensors.numpy``, the
metrics lines without their ``*_seconds`` timings, the trajectory files byte for byte, the summary, and that no
temp file is left behind.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
CYCLES = 3
#: named kill points: (what, cycle index) -- the child exits with KILLED right there
NAMED: list[tuple[str, int]] = [
    ("load", 0),  # during the model load: the run directory holds nothing yet
    ("controller", 0),  # plan.json and run.json written, no cycle run
    *[(f"phase:{p}", i) for i in range(CYCLES) for p in ("rollout", "score", "update", "checkpoint")],
    ("after:trajectories", 1),
    ("after:metrics", 0),  # step 1 is not checkpointed (every_updates 2): restart from step 0
    ("after:metrics", 2),  # the final metrics line is written, its checkpoint is not
    ("inside:checkpoint", 1),  # a partial temp checkpoint directory
    ("after:checkpoint", 2),  # the final checkpoint written, the old one not yet pruned, no summary
    ("after:run", 0),  # every cycle done, summary.json not written
]
RANDOM_KILLS = 10
KILLED = 77


# -- driver (runs in its own process) ---------------------------------------------------------------------------
def _install_kill_point(what: str, cycle: int) -> None:
    """Monkeypatch this (forked, throwaway) process so it dies with ``os._exit(KILLED)`` at ``what``."""
    from miniverl import runtime
    from miniverl.training import checkpoint, controller

    def die() -> None:
        os._exit(KILLED)

    def after(owner: Any, name: str, when: Callable[[tuple[Any, ...]], bool]) -> None:
        original = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if when(args):
                die()
            return result

        setattr(owner, name, wrapped)

    ctl = controller.Controller
    if what == "load":
        runtime.build_runtime = lambda *a, **k: die()  # type: ignore[assignment]
    elif what == "controller":
        after(ctl, "__init__", lambda _args: True)
    elif what.startswith("phase:"):
        phase = what.split(":", 1)[1]
        original = ctl._phase

        def phase_hook(self: Any, name: str, index: int) -> None:
            if name == phase and index == cycle:
                die()
            original(self, name, index)

        ctl._phase = phase_hook  # type: ignore[method-assign,assignment]
    elif what == "after:trajectories":
        after(ctl, "_write_trajectories", lambda args: args[0].state.step == cycle + 1)
    elif what == "after:metrics":
        after(ctl, "_write_metrics", lambda args: args[0].state.step == cycle + 1)
    elif what == "after:checkpoint":
        after(checkpoint, "write_checkpoint", lambda args: args[1].step == cycle + 1)
    elif what == "inside:checkpoint":
        checkpoint.fsync_tree = lambda _root: die()  # type: ignore[assignment]
    elif what == "after:run":
        after(ctl, "run", lambda _args: True)
    else:
        raise ValueError(what)


def _fork(
    run_id: str, resume: bool, log: Path, kill_point: tuple[str, int] | None = None, modules: Path | None = None
) -> int:
    pid = os.fork()
    if pid == 0:  # the child: one CLI run, then exit without running the parent's cleanup
        code = 99
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            if kill_point is not None:
                _install_kill_point(*kill_point)
            from miniverl.cli import main

            argv = ["run", "--plan", "plan.json", "--output", "runs", "--run-id", run_id, "--json", "--threads", "1"]
            code = main([*argv, "--resume"] if resume else argv)
            if modules is not None:
                modules.write_text("\n".join(sorted(sys.modules)))
        finally:
            os._exit(code)
    return pid


def _wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _untimed_metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.endswith("_seconds")} for x in lines]


def _differences(ref: Path, run: Path) -> list[str]:
    """What differs between two finished run directories (empty: identical up to wall-clock timings)."""
    from safetensors.numpy import load_file

    problems: list[str] = []
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    if summary.get("status") != "completed" or summary.get("updates") != CYCLES or summary.get("cycles") != CYCLES:
        problems.append(f"summary {summary.get('status')} {summary.get('updates')}/{summary.get('cycles')}")
    ref_ckpts = sorted(p.name for p in (ref / "checkpoints").iterdir())
    run_ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    if run_ckpts[-1:] != ref_ckpts[-1:]:
        problems.append(f"checkpoints {run_ckpts} != {ref_ckpts}")
        return problems
    last_ref, last_run = ref / "checkpoints" / ref_ckpts[-1], run / "checkpoints" / run_ckpts[-1]
    files = sorted(p.relative_to(last_ref).as_posix() for p in last_ref.rglob("*.safetensors"))
    if files != sorted(p.relative_to(last_run).as_posix() for p in last_run.rglob("*.safetensors")):
        problems.append("different tensor files in the last checkpoint")
    for name in files:
        a, b = load_file(last_ref / name), load_file(last_run / name)
        if a.keys() != b.keys():
            problems.append(f"{name}: different tensor names")
        for key in a:
            if key in b and (a[key].dtype != b[key].dtype or a[key].shape != b[key].shape or (a[key] != b[key]).any()):
                problems.append(f"{name}:{key} differs")
    for field in ("step", "metrics_lines", "trajectories", "data_cursor"):
        x, y = (json.loads((d / "checkpoint.json").read_text())[field] for d in (last_ref, last_run))
        if x != y:
            problems.append(f"checkpoint.json {field} differs")
    if _untimed_metrics(ref) != _untimed_metrics(run):
        problems.append(f"metrics differ ({len(_untimed_metrics(run))} lines)")
    ref_traj = {p.name: p.read_bytes() for p in (ref / "trajectories").iterdir()}
    run_traj = {p.name: p.read_bytes() for p in (run / "trajectories").iterdir()}
    if ref_traj != run_traj:
        problems.append(f"trajectories differ: {sorted(run_traj)} vs {sorted(ref_traj)}")
    stray = [p.name for p in run.rglob("*") if p.name.startswith(".tmp") or p.name.endswith(".tmp")]
    if stray:
        problems.append(f"temp files left: {stray}")
    return problems


def drive(workdir: Path, seed: int) -> dict[str, Any]:
    os.chdir(workdir)
    logs = workdir / "logs"
    logs.mkdir()
    started = time.perf_counter()
    code = _wait(_fork("ref", False, logs / "ref.log", modules=logs / "modules.txt"))
    reference_seconds = time.perf_counter() - started
    if code != 0:
        return {"error": f"reference run exited {code}: {(logs / 'ref.log').read_text()[-2000:]}"}
    # import what a run imports (transformers' model classes, peft, ...) once, here: every fork then starts warm.
    # Importing runs no torch kernels, so the forking parent starts no thread pool.
    for name in (logs / "modules.txt").read_text().split():
        if not name.startswith("__"):
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    started = time.perf_counter()
    code = _wait(_fork("ref-warm", False, logs / "ref-warm.log"))
    warm_seconds = time.perf_counter() - started
    rng = random.Random(seed)
    plans: list[tuple[str, tuple[str, int] | None, float | None]] = [(f"{w}@{c}", (w, c), None) for w, c in NAMED]
    plans += [(f"sigkill@{t:.2f}s", None, t) for t in (rng.uniform(0.0, warm_seconds) for _ in range(RANDOM_KILLS))]
    results = []
    for index, (label, point, delay) in enumerate(plans):
        run_id = f"k{index:02d}"
        log = logs / f"{run_id}.log"
        t0 = time.perf_counter()
        pid = _fork(run_id, False, log, point)
        if delay is not None:
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
        first = _wait(pid)
        t1 = time.perf_counter()
        # A kill before the run directory exists leaves nothing to resume (`--resume` says so, exit 2): the user's
        # retry is the same command again, a fresh run.
        started_dir = (workdir / "runs" / run_id).exists()
        resumed = _wait(_fork(run_id, started_dir, log))
        seconds = [round(t1 - t0, 2), round(time.perf_counter() - t1, 2)]
        problems = _differences(workdir / "runs/ref", workdir / "runs" / run_id) if resumed == 0 else []
        if resumed != 0:
            problems.append(f"resume exited {resumed}: {log.read_text()[-600:]}")
        result = {
            "label": label,
            "first_exit": first,
            "resume_exit": resumed,
            "resumed": started_dir,
            "seconds": seconds,
        }
        results.append({**result, "problems": problems})
    warm = _differences(workdir / "runs/ref", workdir / "runs/ref-warm") if code == 0 else [f"exit {code}"]
    return {"reference_seconds": reference_seconds, "warm_seconds": warm_seconds, "warm": warm, "results": results}


# -- the test --------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill driver forks")
def test_kills_at_random_points_resume_identically(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    from tests.conftest import tiny_config

    config = tiny_config(tiny_model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = [{"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0}]
    config["models"]["student"]["lora"]["dropout"] = 0.1  # the update draws from the RNG: its restore matters
    config["train"]["cycles"] = CYCLES
    config["checkpoint"] = {"every_updates": 2, "keep_last": 1}  # steps 2 and 3 checkpointed, step 1 not
    write_config(config)
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    seed = int(os.environ.get("MINIVERL_KILL_SEED", "20261201"))
    proc = subprocess.run(
        [sys.executable, __file__, str(workdir), str(seed)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((workdir / "kills.json").read_text())
    assert "error" not in report, report["error"]
    assert report["warm"] == [], report["warm"]  # a run forked from the warm driver equals the reference
    results = report["results"]
    assert len(results) >= 20
    failed = [r for r in results if r["problems"]]
    assert not failed, json.dumps(failed, indent=1)[:4000]
    # the kills really happened: named points exit KILLED; random ones are SIGKILLed unless the run finished first
    assert all(r["first_exit"] == KILLED for r in results if not r["label"].startswith("sigkill"))
    assert sum(r["first_exit"] == -signal.SIGKILL for r in results if r["label"].startswith("sigkill")) >= 5


if __name__ == "__main__":
    out = drive(Path(sys.argv[1]), int(sys.argv[2]))
    (Path(sys.argv[1]) / "kills.json").write_text(json.dumps(out, indent=1))
