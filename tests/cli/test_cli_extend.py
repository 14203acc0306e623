"""`miniverl run --resume --extend N`: a 2-cycle run extended by 1 equals a 3-cycle run made in one go,
tensor for tensor (adapter, optimizer) and line for line (metrics minus timings); the lineage is
provable by digests, and bad input exits 2 with one line."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult, tiny_config

TIMINGS = {"rollout_seconds", "update_seconds", "cycle_seconds"}


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(t) for t in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in lines]


def _tensors(path: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(path)


@pytest.fixture()
def two_runs(
    workdir: Path, prompts: Path, tiny_model_dir: Path, write_config: Callable[..., Path], one_torch_thread: None,
    cli: Callable[..., CliResult],
) -> dict[str, Any]:  # fmt: skip
    config = tiny_config(tiny_model_dir)
    write_config(config)
    assert cli("plan", "config.yaml", "--out", "two.json", "--set", "train.cycles=2", "-q").code == 0
    assert cli("plan", "config.yaml", "--out", "three.json", "--set", "train.cycles=3", "-q").code == 0
    one = cli("run", "--plan", "three.json", "--run-id", "once", "--threads", "1", "-q")
    assert one.code == 0, one.err
    two = cli("run", "--plan", "two.json", "--run-id", "ext", "--threads", "1", "-q")
    assert two.code == 0, two.err
    return {"once": workdir / "runs" / "once", "ext": workdir / "runs" / "ext"}


def test_extend_equals_one_go_and_records_lineage(two_runs: dict[str, Any], cli: Callable[..., CliResult]) -> None:
    ext = two_runs["ext"]
    first_plan = (ext / "plan.json").read_bytes()
    first_digest = json.loads(first_plan)["plan_digest"]
    result = cli("run", "--plan", "two.json", "--run-id", "ext", "--resume", "--extend", "1", "--json")
    assert result.code == 0, result.err
    payload = result.json()
    assert payload["status"] == "completed" and payload["updates"] == 3
    assert payload["summary"]["resumed_from_step"] == 2

    once = two_runs["once"]
    assert _metrics(ext) == _metrics(once)
    for name in ("student_params.safetensors", "adapter/adapter_model.safetensors", "optimizer.safetensors"):
        got = _tensors(ext / "checkpoints" / "step-000003" / name)
        want = _tensors(once / "checkpoints" / "step-000003" / name)
        assert set(got) == set(want), name
        for key, tensor in want.items():
            assert got[key].dtype == tensor.dtype and got[key].equal(tensor), (name, key)

    # lineage: the previous plan is kept byte for byte, the new plan names it and verifies
    from miniverl.config.plan import load_plan, plan_ancestry

    assert (ext / "plans" / f"{first_digest}.json").read_bytes() == first_plan
    plan, config = load_plan(ext / "plan.json")
    assert config.train.cycles == 3 and plan.updates == 3
    assert [e.model_dump() for e in plan.lineage] == [
        {"previous_plan_digest": first_digest, "previous_cycles": 2, "added_cycles": 1}
    ]
    assert plan_ancestry(plan, ext / "plans") == [plan.plan_digest, first_digest]
    assert json.loads((ext / "checkpoints" / "step-000003" / "checkpoint.json").read_text())["plan_digest"] == (
        plan.plan_digest
    )

    # resuming the extended run with its plan is a no-op that changes no file
    before = {p: p.read_bytes() for p in sorted(ext.rglob("*")) if p.is_file()}
    again = cli("run", "--plan", str(ext / "plan.json"), "--run-id", "ext", "--resume", "--json")
    assert again.code == 0, again.err
    assert again.json()["resumed"] is False
    assert {p: p.read_bytes() for p in sorted(ext.rglob("*")) if p.is_file()} == before

    # the report's training time covers both segments, not only the extension's
    import math

    report = cli("report", str(ext), "--json")
    assert report.code == 0, report.err
    time = report.json()["time"]
    seconds = [json.loads(t)["cycle_seconds"] for t in (ext / "metrics.jsonl").read_text().splitlines()]
    assert time["cycles_timed"] == 3 and time["cycle_seconds_total"] == pytest.approx(math.fsum(seconds))
    assert time["last_segment_wall_seconds"] == json.loads((ext / "summary.json").read_text())["wall_seconds"]

    # the old plan is refused with a hint, in one line, exit 2
    old = cli("run", "--plan", "two.json", "--run-id", "ext", "--resume")
    assert old.code == 2 and old.err.count("\n") == 1 and "plan.json" in old.err, old.err

    # a tampered previous plan breaks the proof
    kept = ext / "plans" / f"{first_digest}.json"
    data = json.loads(kept.read_text())
    data["overrides"] = ["train.cycles=9"]
    kept.write_text(json.dumps(data))
    broken = cli("run", "--plan", str(ext / "plan.json"), "--run-id", "ext", "--resume", "--extend", "1")
    assert broken.code == 2 and "lineage" in broken.err and broken.err.count("\n") == 1, broken.err


def test_extend_bad_input_exits_2(
    workdir: Path, prompts: Path, tiny_model_dir: Path, write_config: Callable[..., Path],
    cli: Callable[..., CliResult],
) -> None:  # fmt: skip
    write_config(tiny_config(tiny_model_dir))
    assert cli("plan", "config.yaml", "--out", "plan.json", "-q").code == 0
    cases = [
        (["--extend", "1"], "--resume"),
        (["--resume", "--extend", "0"], "N >= 1"),
        (["--resume", "--extend", "2"], "nothing to extend"),
        (["--resume", "--extend", "x"], "invalid int"),
    ]
    for extra, needle in cases:
        result = cli("run", "--plan", "plan.json", "--run-id", "nope", *extra)
        assert result.code == 2, (extra, result.err)
        assert result.err.count("\n") == 1 and needle in result.err and "Traceback" not in result.err, result.err


class _Killed(Exception):
    pass


def _kill_at(cycle_index: int) -> Any:
    def on_phase(name: str, index: int) -> None:
        if name == "rollout" and index == cycle_index:
            raise _Killed

    return on_phase


def test_extend_an_interrupted_run_and_resume_an_interrupted_extension(
    two_runs: dict[str, Any], workdir: Path, cli: Callable[..., CliResult]
) -> None:
    from miniverl.training.entry import run_from_plan

    # a run killed after its first update ("running") is extended by 1: 3 cycles in all
    with pytest.raises(_Killed):
        run_from_plan(Path("two.json"), output=Path("runs"), run_id="cut", on_phase=_kill_at(1))
    result = cli("run", "--plan", "two.json", "--run-id", "cut", "--resume", "--extend", "1", "-q")
    assert result.code == 0, result.err
    assert _metrics(workdir / "runs" / "cut") == _metrics(two_runs["once"])

    # an extension killed before its first new checkpoint resumes from the previous plan's checkpoint
    ext = two_runs["ext"]
    with pytest.raises(_Killed):
        run_from_plan(Path("two.json"), output=Path("runs"), run_id="ext", resume=True, extend=1, on_phase=_kill_at(2))
    assert json.loads((ext / "plan.json").read_text())["cycles"] == 3
    result = cli("run", "--plan", str(ext / "plan.json"), "--run-id", "ext", "--resume", "-q")
    assert result.code == 0, result.err
    assert _metrics(ext) == _metrics(two_runs["once"])
    got = _tensors(ext / "checkpoints" / "step-000003" / "optimizer.safetensors")
    want = _tensors(two_runs["once"] / "checkpoints" / "step-000003" / "optimizer.safetensors")
    assert all(got[k].equal(v) for k, v in want.items())
