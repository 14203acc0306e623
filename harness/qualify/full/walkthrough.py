"""Shared code of the PPO/RM/handoff and product-walkthrough workloads: driving run/resume/handoff through the
installed CLI, keeping the small files a judge needs, and pure readers that compare checkpoints and metrics.

Everything a judge calls here reads evidence through :mod:`harness.qualify.full.reading` (bounded, strict, never
raises).
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.core.jsonio import canonical_bytes, sha256_bytes
from harness.core.proc import HARNESS_DIR, Redactor, clean_env
from harness.core.records import CheckpointHashes, Invocation
from harness.install import verl_env
from harness.qualify.full import runs, statehash
from harness.qualify.full.base import Context, Scale
from harness.qualify.full.reading import count, finite, read_json, read_jsonl
from harness.qualify.transcript import CliResult, run_captured

WORKLOADS = HARNESS_DIR / "workloads"
EVIDENCE = "evidence"  # the folder under ctx.work that holds the files ``run`` returns
COPY_LIMIT_BYTES = 4 << 20  # a run file bigger than this is not evidence (metrics and trajectories are KBs)
TENSOR_SUFFIX = ".safetensors"
# Checkpoint files whose sha256 must agree between a run and its replay, by algorithm (the actor adapter and its
# optimizer; PPO adds the critic and its optimizer). Every other tensor file of the checkpoint must agree too.
REPLAY_REQUIRED = {
    "ppo": ("adapter/adapter_model.safetensors", "optimizer.safetensors", "critic_params.safetensors",
            "critic_optimizer.safetensors"),
    "grpo": ("adapter/adapter_model.safetensors", "optimizer.safetensors"),
}  # fmt: skip
VERL_COMPILER_PPO = "verl-rl-v0.9-single-gpu-v2"
VERL_COMPILER_GRPO = "verl-rl-v0.9-single-gpu-v1"
VERL_VERSION = "0.9.1"  # the verl a bundle is diagnosed with


# ----------------------------------------------------------------------------------------------- running


def scale_sets(scale: Scale) -> list[str]:
    """``--set`` argv for the scale's device and rollout sizes (the sizes are never left to the YAML)."""
    sizes = (f"rollout.{key}={value}" for key, value in runs.declared_sizes(scale).items())
    return scale.overrides() + [arg for value in sizes for arg in ("--set", value)]


def redact_json(value: Any, ctx: Context) -> Any:
    if isinstance(value, str):
        return ctx.cli.redact.text(value)
    if isinstance(value, dict):
        return {str(k): redact_json(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_json(v, ctx) for v in value]
    return value


def evidence_dir(ctx: Context) -> Path:
    path = ctx.work / EVIDENCE
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_evidence(ctx: Context, name: str, value: dict[str, Any]) -> Path:
    """A JSON evidence file (redacted, canonical) under the work dir's evidence folder."""
    path = evidence_dir(ctx) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(canonical_bytes(redact_json(value, ctx)) + b"\n")
    return path


def keep_json(ctx: Context, result: CliResult, name: str) -> Path | None:
    """The ``--json`` output of a successful step, saved redacted as evidence (None if it printed no object)."""
    data = result.json() if result.ok else None
    return write_evidence(ctx, name, data) if data is not None else None


def keep_file(ctx: Context, source: Path, name: str) -> Path | None:
    """A copy of a small regular file the CLI wrote (None if it is missing, not regular or too big)."""
    try:
        info = source.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_size > COPY_LIMIT_BYTES:
        return None
    dest = evidence_dir(ctx) / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    return dest


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:06d}"


def run_module(ctx: Context, step: str, python: Path, args: list[str], *, timeout: float = 900) -> CliResult:
    """``PYTHON -m miniverl ARGS`` in another environment (verl's), recorded in the workload's transcript with
    its interpreter in argv, so the transcript says which environment ran it. The candidate overlay
    (``ctx.verl_overlay``) comes first on PYTHONPATH, so the miniverl it runs is the candidate's."""
    env = clean_env({**ctx.cli.extra_env, **verl_env.child_env(ctx.verl_overlay)}, path_prefix=python.parent)
    with ctx.cli.slot(step):
        ran = run_captured([str(python), "-m", "miniverl", *args], cwd=ctx.work, env=env, timeout=timeout)
    code, out, err, timed_out = ran.code, ran.out, ran.err, ran.timed_out
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    interpreter = verl_label(ctx, python)
    installed = ctx.verl_installed.model_copy(update={"executable": interpreter}) if ctx.verl_installed else None
    invocation = Invocation(
        step=step,
        argv=[interpreter, "-m", "miniverl", *ctx.cli.redact.argv(args)],
        exit_code=code,
        duration_seconds=round(ran.seconds, 3),
        timed_out=timed_out,
        stdout_bytes=len(out),
        stdout_sha256=sha256_bytes(out),
        stderr_bytes=len(err),
        stderr_sha256=sha256_bytes(err),
        stderr_last_line=ctx.cli.redact.text(lines[-1][:300]) if lines else "",
        installed=installed,
    )
    result = CliResult(invocation, out, err)
    ctx.cli.results.append(result)
    return result


def verl_label(ctx: Context, python: Path) -> str:
    """The interpreter as ``<verl-venv>/bin/python`` (its venv named, no local path)."""
    return ctx.cli.redact.text(Redactor({"verl-venv": python.parent.parent}).text(str(python)))


def diagnose_environment(ctx: Context) -> dict[str, Any]:
    """Which environment diagnoses the bundle: verl's own venv (``ctx.verl_python``) with the candidate overlaid,
    or none; and which verl and miniverl that interpreter imports (probed now, the overlay named, no local path)."""
    if ctx.verl_python is None:
        return {"verl_python": None, "reason": "no environment with verl 0.9.1 was given (ctx.verl_python is None)"}
    python = Path(ctx.verl_python)
    inside = python.is_relative_to(ctx.cli.venv)
    reason = "the candidate's venv" if inside else "verl 0.9.1's own environment"
    if ctx.verl_overlay is not None:
        reason += ", the candidate wheel overlaid first on PYTHONPATH"
    return {
        "verl_python": verl_label(ctx, python),
        "reason": reason,
        **verl_env.observed(python, ctx.verl_overlay, cwd=ctx.work),
    }


# ----------------------------------------------------------------------------------------------- judging


def transcript_invocations(path: Path | None) -> list[dict[str, Any]] | None:
    """Every invocation of a transcript (each a JSON object with a string step and an int exit code), or None."""
    doc = read_json(path)
    rows = doc.get("invocations") if doc is not None else None
    if not isinstance(rows, list):
        return None
    for inv in rows:
        if not isinstance(inv, dict) or not isinstance(inv.get("step"), str) or count(inv.get("exit_code")) is None:
            return None
    return rows


def step_ok(invocations: list[dict[str, Any]] | None, step: str) -> tuple[bool, str]:
    """The step ran exactly once, exit 0, not timed out."""
    if invocations is None:
        return False, "the transcript is missing or unreadable"
    runs = [inv for inv in invocations if inv["step"] == step]
    if len(runs) != 1:
        return False, f"step {step} ran {len(runs)} times (want once)"
    inv = runs[0]
    if inv["exit_code"] != 0 or inv.get("timed_out") is not False:
        return False, f"step {step} exited {inv['exit_code']} (timed out: {inv.get('timed_out')}): " + str(
            inv.get("stderr_last_line", "")
        )[:160]
    return True, f"{step} exit 0"


def metrics(path: Path | None, algorithm: str) -> list[dict[str, Any]] | None:
    """``metrics.jsonl`` lines, every one of ``algorithm``, or None."""
    rows = read_jsonl(path)
    if rows is None or not all(row.get("algorithm") == algorithm for row in rows):
        return None
    return rows


def algo_metric(line: dict[str, Any], key: str) -> float | None:
    extra = line.get("algorithm_metrics")
    return finite(extra.get(key)) if isinstance(extra, dict) else None


def steps_of(lines: list[dict[str, Any]]) -> list[Any]:
    return [line.get("step") for line in lines]


def keep_state_hashes(ctx: Context, name: str, checkpoints: dict[str, Path]) -> Path:
    """The harness's own sha256 of each labelled checkpoint directory's files (label = the evidence role of its
    kept checkpoint.json), taken while the work dir still holds them."""
    return statehash.write_state_hashes(evidence_dir(ctx) / name, checkpoints)


def _hashed_pair(
    evidence: dict[str, Path], first: str, second: str
) -> tuple[tuple[CheckpointHashes, CheckpointHashes] | None, str]:
    """Checkpoints ``first`` and ``second`` (roles of kept checkpoint.json files) as the harness hashed them, and
    what those checkpoint.json files misstate of the harness's digests ("" when nothing); or None and why one of
    them was not hashed."""
    hashes = statehash.read_state_hashes(evidence.get("state_hashes"))
    a, why_a = statehash.checkpoint(hashes, first)
    b, why_b = statehash.checkpoint(hashes, second)
    if a is None or b is None:
        return None, why_a or why_b
    told = [statehash.product_agrees(hashes, role, evidence.get(role)) for role in (first, second)]
    return (a, b), "; ".join(why for agrees, why in told if not agrees)


def replay_exact(evidence: dict[str, Path], run: str, replay: str, algorithm: str) -> tuple[bool, str]:
    """Two checkpoints of the same step hold byte-identical tensors by the harness's own sha256: every
    ``.safetensors`` file of both is the same, and the algorithm's actor/critic/optimizer files are among them;
    and each kept checkpoint.json (roles ``run``, ``replay``) states exactly the harness's digests."""
    pair, lies = _hashed_pair(evidence, run, replay)
    if pair is None or lies:
        return False, lies
    a, b = pair
    if a.step < 1 or a.step != b.step:
        return False, f"checkpoint steps {a.step} vs {b.step} (want the same step >= 1)"
    tensors_a = {k: v.sha256 for k, v in a.files.items() if k.endswith(TENSOR_SUFFIX)}
    tensors_b = {k: v.sha256 for k, v in b.files.items() if k.endswith(TENSOR_SUFFIX)}
    missing = [k for k in REPLAY_REQUIRED.get(algorithm, ("?",)) if k not in tensors_a or k not in tensors_b]
    if missing:
        return False, f"step {a.step}: {missing} not in both checkpoints"
    if set(tensors_a) != set(tensors_b):
        return False, f"step {a.step}: tensor files differ: {sorted(set(tensors_a) ^ set(tensors_b))[:6]}"
    differ = sorted(k for k in tensors_a if tensors_a[k] != tensors_b[k])
    if differ:
        return False, f"step {a.step}: the harness's sha256 differs for {differ[:6]}"
    return True, (
        f"step {a.step}: {len(tensors_a)} tensor files byte-identical by the harness's sha256 "
        f"({', '.join(sorted(tensors_a))}); both checkpoint.json files state the harness's digests"
    )


def changed(evidence: dict[str, Path], before: str, after: str, names: Iterable[str]) -> tuple[bool, str]:
    """Each named checkpoint file has a different sha256 (the harness's own) at ``after`` than at ``before``,
    and both kept checkpoint.json files state the harness's digests."""
    pair, lies = _hashed_pair(evidence, before, after)
    if pair is None:
        return False, lies
    a, b = pair
    same = [n for n in names if n not in a.files or n not in b.files or a.files[n].sha256 == b.files[n].sha256]
    why = ("unchanged or missing between the checkpoints: " + ", ".join(same)) if same else "changed"
    return not same and not lies, why + (f"; {lies}" if lies else " (the harness's sha256)")


def unduplicated(lines: list[dict[str, Any]] | None, checkpoint: Path | None, updates: int) -> tuple[bool, str]:
    """One metrics line per update (steps 1..updates, none repeated) and the last checkpoint commits exactly that:
    ``metrics_lines == updates``, one trajectories file per cycle (distinct names and digests)."""
    if lines is None:
        return False, "metrics.jsonl missing or unreadable"
    doc = read_json(checkpoint)
    if doc is None:
        return False, "checkpoint.json missing or unreadable"
    steps = steps_of(lines)
    if steps != list(range(1, updates + 1)):
        return False, f"metrics steps {steps[:8]} (want 1..{updates}, once each)"
    trajectories = doc.get("trajectories")
    if count(doc.get("metrics_lines")) != updates or count(doc.get("step")) != updates:
        return False, f"checkpoint step {doc.get('step')} commits {doc.get('metrics_lines')} lines (want {updates})"
    if not isinstance(trajectories, dict):
        return False, "checkpoint.json lists no trajectories"
    names = sorted(trajectories)
    wanted = [f"cycle-{c:06d}.jsonl" for c in range(1, updates + 1)]
    digests = list(trajectories.values())
    if names != wanted or len(set(digests)) != len(digests) or not all(isinstance(d, str) for d in digests):
        return False, f"checkpoint trajectories {names[:6]} (want {wanted}, distinct digests)"
    return True, f"steps {steps}, {len(names)} trajectory files, checkpoint commits {updates} lines"
