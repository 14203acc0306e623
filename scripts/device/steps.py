"""The device scripts' steps (``agreement.py``, ``vllm_smoke.py``): each command run with a timeout that never
passes the call's deadline, its exit code and seconds kept in a JSON report, the tail of its output in a log, and
both written under ``$OUT`` after every step (so a call cut off at its limit still brings back what ran)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any


def sha256(path: Path) -> str:
    """A file's sha256, read in MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def checkout_facts(repo: Path) -> dict[str, Any]:
    """The checkout's ``HEAD`` and whether the files that ran are that commit's. A device call sends the working
    tree beside a ``.git`` that can be older (the session's first ``HEAD``), so ``git_head`` alone can name a
    commit whose code did not run: ``tree_matches_head`` false says so."""
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain"], capture_output=True, text=True)
    return {
        "git_head": head.stdout.strip() or None,
        "tree_matches_head": status.returncode == 0 and head.returncode == 0 and not status.stdout.strip(),
    }


class Steps:
    def __init__(self, work: Path, out: Path, deadline: float, name: str, **report: Any) -> None:
        self.work, self.out, self.deadline, self.name = work, out, deadline, name
        self.report: dict[str, Any] = {"steps": {}, **report}
        self.log = (out / f"{name}.log").open("a", encoding="utf-8")

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def save(self) -> None:
        (self.out / f"{self.name}.json").write_text(json.dumps(self.report, indent=1, sort_keys=True) + "\n")

    def step(self, name: str, argv: list[str], env: dict[str, str], *, cap_s: float) -> bool:
        timeout = max(5.0, min(cap_s, self.deadline - time.monotonic()))
        self.say(f"$ {' '.join(argv)}  (timeout {timeout:.0f} s)")
        started = time.monotonic()
        try:
            done = subprocess.run(argv, cwd=self.work, env=env, capture_output=True, text=True, timeout=timeout)
            code, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            partial = b"".join(x if isinstance(x, bytes) else x.encode() for x in (exc.stdout, exc.stderr) if x)
            code, output = 124, f"{partial.decode(errors='replace')}\ntimed out after {timeout:.0f} s"
        seconds = time.monotonic() - started
        self.report["steps"][name] = {"exit_code": code, "seconds": round(seconds, 2)}
        tail = [line for line in str(output).splitlines() if line.strip()][-40:]
        self.log.write("".join(f"  | {line}\n" for line in tail))
        self.say(f"{name}: exit {code} after {seconds:.1f} s")
        self.save()
        return code == 0
