"""A real PPO interruption, judged from what the harness saw: the interrupted run's stderr (its progress lines, bound
to the transcript by sha256), the harness's own record of the signal and of the run directory it left
(``interrupt.json``), and the harness's hashes of the checkpoint it left.

The product announces each phase of a cycle on stderr (``<UTC stamp> miniverl: cycle 2/2 actor_pass: 1/1 ...``,
then ``critic_pass``, ``checkpoint``, and ``cycle 2/2  loss ...`` when the cycle is done). The harness sends SIGTERM
as soon as the second cycle's ``actor_pass`` line appears. The stop landed inside that pass when the run printed no
later phase before its documented interrupted exit (130) and its one ``miniverl: interrupted; ...`` line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.qualify.full.reading import count, file_sha256, read_json, read_text

INTERRUPTED_EXIT = 130  # docs/CLI-CONTRACT.md: SIGTERM stops a run as Ctrl-C does
SIGNAL = "SIGTERM"
# A progress line: the reporter's UTC stamp (never judged), then what the product says it is doing.
PROGRESS = re.compile(r"^\S+ miniverl: (?P<message>.*)$")
PHASE = re.compile(r"^cycle (?P<cycle>\d+)/(?P<cycles>\d+) (?P<phase>[a-z_ ]+?)(?::|$)")
CYCLE_DONE = re.compile(r"^cycle (?P<cycle>\d+)/(?P<cycles>\d+)  loss ")
INTERRUPTED = "miniverl: interrupted; the run continues from its last complete checkpoint"


def event_marker(cycle: int, cycles: int) -> str:
    """What the harness waits for on stderr: the product entering ``cycle``'s actor pass."""
    return f" miniverl: cycle {cycle}/{cycles} actor_pass: "


def phases(text: str) -> list[tuple[int, str]]:
    """(cycle, phase) of every progress line, in order; a finished cycle is (cycle, "done")."""
    out: list[tuple[int, str]] = []
    for line in text.splitlines():
        found = PROGRESS.match(line)
        if found is None:
            continue
        message = found["message"]
        done = CYCLE_DONE.match(message)
        if done is not None:
            out.append((int(done["cycle"]), "done"))
            continue
        phase = PHASE.match(message)
        if phase is not None:
            out.append((int(phase["cycle"]), phase["phase"]))
    return out


def judge(
    evidence: dict[str, Path], invocations: list[dict[str, Any]] | None, step: str, cycle: int, cycles: int
) -> tuple[bool, str]:
    """The run of ``step`` was stopped by SIGTERM inside ``cycle``'s actor pass, exited as documented, and left
    exactly the checkpoints of the cycles before it, nothing half-written."""
    record = read_json(evidence.get("interrupt"))
    text = read_text(evidence.get("interrupted_stderr"))
    if record is None or text is None:
        return False, "interrupt.json or the interrupted run's stderr missing or unreadable"
    ran = [inv for inv in invocations or [] if isinstance(inv, dict) and inv.get("step") == step]
    if len(ran) != 1:
        return False, f"the transcript holds {len(ran)} invocations of {step!r} (want 1)"
    inv = ran[0]
    kept = file_sha256(evidence.get("interrupted_stderr"))
    if inv.get("stderr_sha256") != kept:
        return False, f"the kept stderr is not {step!r}'s (its sha256 is not the transcript's)"
    event = record.get("event")
    seen = phases(text)
    lines = text.splitlines()
    wanted = (cycle, "actor_pass")
    after = seen[seen.index(wanted) + 1 :] if wanted in seen else []
    before = seen[: seen.index(wanted)] if wanted in seen else []
    committed = [(c, "done") for c in range(1, cycle)]
    problems = [
        problem
        for problem, bad in (
            (f"signal {record.get('signal')!r} (want {SIGNAL})", record.get("signal") != SIGNAL),
            ("never signalled", record.get("signalled") is not True),
            (
                f"exit {inv.get('exit_code')} / {record.get('exit_code')} (want {INTERRUPTED_EXIT})",
                inv.get("exit_code") != INTERRUPTED_EXIT or record.get("exit_code") != INTERRUPTED_EXIT,
            ),
            ("the event is not a line of the stderr", not isinstance(event, str) or event not in lines),
            (
                f"the event is not cycle {cycle}'s actor pass",
                not isinstance(event, str) or event_marker(cycle, cycles) not in event,
            ),
            (f"cycle {cycle}'s actor pass never began", wanted not in seen),
            (f"the cycles before it did not finish: {before}", [p for p in before if p[1] == "done"] != committed),
            (f"it went on after the actor pass: {after}", bool(after)),
            ("no interrupted exit line last", not lines or not lines[-1].startswith(INTERRUPTED)),
        )
        if bad
    ]
    left_ok, left_why = _left(record, cycle)
    ok = not problems and left_ok
    why = (
        f"{step}: {'; '.join(problems) if problems else f'SIGTERM on {event!r}, no later phase, exit 130'}; {left_why}"
    )
    return ok, why


def _left(record: dict[str, Any], cycle: int) -> tuple[bool, str]:
    """What the harness found in the run directory once the stopped run had exited."""
    done = cycle - 1
    checkpoints = record.get("checkpoints_after")
    trajectories = record.get("trajectories_after")
    ok = (
        checkpoints == [f"step-{s:06d}" for s in range(1, done + 1)]
        and trajectories == [f"cycle-{s:06d}.jsonl" for s in range(1, done + 1)]
        and record.get("temp_entries_after") == []
        and record.get("summary_written") is False
        and count(record.get("metrics_lines_after")) == done
    )
    return ok, (
        f"left checkpoints {str(checkpoints)[:120]}, trajectories {str(trajectories)[:120]}, temp entries "
        f"{str(record.get('temp_entries_after'))[:120]}, summary written {record.get('summary_written')!r}, "
        f"{record.get('metrics_lines_after')!r} metrics lines (want exactly the {done} finished update(s), "
        "nothing half-written)"
    )
