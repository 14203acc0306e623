"""The smollm2 resume workload: its judge on real captured evidence, one bad value per check, hostile evidence,
and the CliDriver's interrupt capability on a stand-in CLI."""

from __future__ import annotations

import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit, bad_value_cases

from harness.core import policy
from harness.core.proc import Redactor
from harness.qualify.full import smollm2
from harness.qualify.transcript import CliDriver

W = smollm2.WORKLOAD
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
_evidence, _judge, _failed, _path = KIT.evidence, KIT.judge, KIT.failed, KIT.path
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set


def _cuda(baseline: int = 100 << 20, final: int = 100 << 20, peak: int = 2 << 30) -> Callable[[Path], None]:
    return KIT.cuda("a_summary", "b_summary", baseline=baseline, final=final, peak=peak)


def test_the_real_cpu_evidence_passes_every_required_check() -> None:
    checks = _judge(FIXTURE)
    assert set(policy.required_checks(CPU, "smollm2")) <= set(checks)
    assert all(checks.values()), checks
    assert "teardown" not in checks  # CUDA-only: not judged on a CPU profile


def test_the_evidence_members_are_declared_and_small() -> None:
    members = KIT.members()
    assert members == sorted(W.evidence.values())
    assert KIT.fixture_bytes() < 300_000
    assert all(m.startswith("v011/smollm2/") for m in members)


BAD: dict[str, list[Callable[[Path], None]]] = {
    "run_completed": [
        _exit("run_a", 1),
        _exit("run_b_resume", 2),
        _set("a_summary", "status", "failed"),
        _set("b_summary", "cycles", 1),
        lambda root: [_edit_line(root, role, 1, "loss", None) for role in ("a_metrics", "b_metrics")],
        _set("plan_output", "plan_digest", "f" * 64),
        _set("plan", "plan_digest", "e" * 64),  # the plan file is not the plan that ran
        lambda root: _edit_json(root, "plan", lambda d: d["config"]["rollout"].update(prompts_per_cycle=1)),
        lambda root: _edit_json(root, "plan", lambda d: d["config"]["models"].update(device="auto")),
    ],
    "resume_tensor_exact": [
        KIT.forged("b_checkpoint", "adapter/adapter_model.safetensors"),  # run B really holds other bytes
        KIT.forged("a_checkpoint", "rng.safetensors"),
        # the harness's own hashes differ from what checkpoint.json, the product's, says
        KIT.harness_hash("b_checkpoint", "adapter/adapter_model.safetensors"),
        KIT.harness_hash("a_checkpoint", "optimizer.safetensors"),
        KIT.harness_hash("b_checkpoint", "rng.safetensors"),
        KIT.refused("a_checkpoint"),
        # the product's checkpoint.json states a digest the harness did not find (in both runs alike)
        lambda root: [_digest(r, "adapter/adapter_model.safetensors")(root) for r in ("a_checkpoint", "b_checkpoint")],
        lambda root: [_digest(r, "state.json")(root) for r in ("a_checkpoint", "b_checkpoint")],
        _digest("b_checkpoint", "adapter/adapter_model.safetensors"),
        _digest("a_checkpoint", "optimizer.safetensors"),
        _digest("b_checkpoint", "rng.safetensors"),
        lambda root: _edit_line(root, "b_metrics", 1, "reward_mean", 0.123456),
        lambda root: _edit_line(root, "b_metrics", 0, "grad_norm", 1e9),
        _set("interrupt", "signalled", False),
        _set("interrupt", "exit_code", 0),
        _set("interrupt", "metrics_lines_after_interrupt", 2),
        _set("interrupt", "summary_written", True),
        _exit("run_b_interrupted", 0),
        _set("b_summary", "resumed_from_step", None),
        _set("b_checkpoint", "step", 1),
        _set("b_resume_output", "resumed", False),
        # the same in both runs, so only "every update moved the adapter" is wrong
        lambda root: [_edit_line(root, role, 0, "adapter_delta_norm", 0.0) for role in ("a_metrics", "b_metrics")],
        _set("b_resume_output", "status", "failed"),
    ],
}


@pytest.mark.parametrize(("check", "index"), bad_value_cases(BAD))
def test_one_bad_value_fails_exactly_its_check(ev: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert _failed(ev) == {check}


def test_the_time_and_memory_figures_may_differ_between_the_runs(ev: Path) -> None:
    _edit_line(ev, "b_metrics", 1, "cycle_seconds", 1234.5)
    _edit_line(ev, "b_metrics", 0, "update_seconds", 0.001)
    assert _failed(ev) == set()


def test_cuda_teardown_is_judged_from_both_summaries_on_a_cuda_profile(ev: Path) -> None:
    KIT.plans_on(ev, CUDA)
    _cuda()(ev)
    assert _failed(ev, CUDA) == set() and "teardown" in _judge(ev, CUDA)
    _cuda(final=(100 << 20) + (64 << 20))(ev)
    assert _failed(ev, CUDA) == {"teardown"}


def test_a_cuda_profile_without_a_cuda_block_fails_teardown(ev: Path) -> None:
    assert _failed(ev, CUDA) == {"run_completed", "teardown"}  # planned on the CPU at reduced size, too
    KIT.plans_on(ev, CUDA)
    assert _failed(ev, CUDA) == {"teardown"}


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    KIT.spoil(ev, role, kind)
    assert _failed(ev)


# -- CliDriver.interrupt ---------------------------------------------------------------------------------

STAND_IN = """#!{python}
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (sys.stderr.write("miniverl: interrupted\\n"), sys.exit(130)))
mode = sys.argv[1]
if mode == "exit":
    sys.exit(0)
time.sleep(0.2)
if mode == "write":
    os.makedirs("runs/b/checkpoints/step-000001", exist_ok=True)
    open("runs/b/checkpoints/step-000001/checkpoint.json", "w").write("{{}}")
if mode == "say":
    sys.stderr.write("T miniverl: cycle 1/2 actor_pass: 1/1\\nT miniverl: cycle 2/2 actor_")
    sys.stderr.flush()
    time.sleep(0.3)  # half a line: never taken for the event
    sys.stderr.write("pass: 1/1\\n")
    sys.stderr.flush()
time.sleep(30)
sys.exit(0)
"""


def _driver(tmp_path: Path) -> CliDriver:
    venv, work = tmp_path / "venv", tmp_path / "work"
    (venv / "bin").mkdir(parents=True)
    work.mkdir()
    exe = venv / "bin" / "miniverl"
    exe.write_text(STAND_IN.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return CliDriver(venv=venv, work=work, redact=Redactor({"work": work, "venv": venv}), installed=None)


WAIT = Path("runs/b/checkpoints/step-000001/checkpoint.json")


def test_interrupt_signals_the_child_once_the_file_exists_and_records_it(tmp_path: Path) -> None:
    cli = _driver(tmp_path)
    stopped = cli.interrupt("run_b_interrupted", ["write"], wait_for=WAIT, timeout=20)
    assert stopped.signalled and stopped.signal == "SIGTERM" and stopped.wait_for == WAIT.as_posix()
    assert stopped.appeared_after_seconds is not None and stopped.appeared_after_seconds >= 0.2
    inv = stopped.result.invocation
    assert inv.exit_code == 130 and not inv.timed_out and inv.stderr_last_line == "miniverl: interrupted"
    assert inv.duration_seconds < 20
    assert [i.step for i in cli.transcript().invocations] == ["run_b_interrupted"]


def test_interrupt_signals_the_child_once_its_stderr_prints_the_line_and_records_the_line(tmp_path: Path) -> None:
    cli = _driver(tmp_path)
    stopped = cli.interrupt("cut", ["say"], wait_for_line=" miniverl: cycle 2/2 actor_pass: ", timeout=20)
    assert stopped.signalled and stopped.event == "T miniverl: cycle 2/2 actor_pass: 1/1"
    assert stopped.appeared_after_seconds is not None and stopped.appeared_after_seconds >= 0.5
    assert stopped.result.invocation.exit_code == 130 and stopped.result.stderr.endswith(b"miniverl: interrupted\n")
    with pytest.raises(ValueError, match="exactly one"):
        cli.interrupt("both", ["say"], wait_for=WAIT, wait_for_line="x")


def test_interrupt_of_a_child_that_exits_first_records_it_unsignalled(tmp_path: Path) -> None:
    cli = _driver(tmp_path)
    stopped = cli.interrupt("early", ["exit"], wait_for=WAIT, timeout=20)
    assert not stopped.signalled and stopped.appeared_after_seconds is None
    assert stopped.result.invocation.exit_code == 0 and stopped.result.ok


def test_interrupt_kills_a_child_that_outlives_the_timeout(tmp_path: Path) -> None:
    cli = _driver(tmp_path)
    stopped = cli.interrupt("slow", ["sleep"], wait_for=WAIT, timeout=1)
    inv = stopped.result.invocation
    assert not stopped.signalled and inv.timed_out and inv.exit_code == 124
    assert inv.duration_seconds < 10


def test_interrupt_of_a_missing_executable_is_recorded_not_raised(tmp_path: Path) -> None:
    cli = _driver(tmp_path)
    (cli.venv / "bin" / "miniverl").unlink()
    stopped = cli.interrupt("gone", ["write"], wait_for=WAIT, timeout=5)
    assert stopped.result.invocation.exit_code == 127 and not stopped.signalled
