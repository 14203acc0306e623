"""Policy refreshes, grouped trajectory identity and the vLLM boundary (issue #11, v0.11; re-derived in issue #31).

Part of the backend-matrix workload (:mod:`harness.qualify.full.backend_matrix` calls :func:`run_refreshes` from its
``run`` and :func:`judge_refreshes` from its ``judge``, and merges :data:`REFRESH_EVIDENCE` into its evidence).

``run_refreshes`` drives the installed CLI: for each in-process rollout engine (``rollout.engine: fast`` and
``hf``) one GRPO run of ``scale.policy_refreshes`` cycles at the fixed :data:`REFRESH_SIZES` (the refresh proves
that rollout and trained weights agree after every update, which the batch size does not change; a small fixed
size keeps it cheap on every profile), with the scale's device and quantization, keeping its plan, summary,
metrics, per-cycle trajectories and each update's ``checkpoint.json`` (``refresh-grpo.yaml`` checkpoints every
update and keeps all 8). While the work dir exists the harness hashes every file each checkpoint lists into the
engine's ``state-hashes.json`` (:mod:`harness.qualify.full.statehash`; for update 1 also the adapter's lora_B
tensors). Then ``miniverl plan`` with ``rollout.backend=vllm`` at the same cycles and sizes, whose result (exit code,
last stderr line, whether a plan was written) it saves; where the plan is accepted (vllm importable: on the GPU
machine, a ``--vllm-site`` given to ``harness full``) it runs it like the engines' and keeps the same files and
state hashes under ``vllm/``. ``judge_refreshes`` decides, from those files only:

* ``policy_refreshes``: per engine (and vllm, where its plan was accepted; where it was refused the chain is
  fast's and hf's and ``vllm_boundary`` says why), one metrics line per update with ``rollout_backend`` the engine
  asked for;
  from the harness's own hashes, the checkpoint of every update k (its ``step`` k, read by the harness), whose
  kept ``checkpoint.json`` is the one the harness hashed, states exactly the harness's digests and commits exactly
  the kept trajectories of cycles 1..k (so hashes or checkpoints of another run or engine fail); update 1 moved a
  lora_B tensor off its all-zero init and every later update changed the harness's sha256 of
  ``adapter_model.safetensors``. The product's digests must name the harness's states one to one
  (``policy_digest_after[j] == policy_digest_after[k]`` exactly where the harness's adapter hashes are equal, and
  ``policy_digest_before[1]`` none of them), and chain: ``policy_digest_rollout[k] == policy_digest_before[k] ==
  policy_digest_after[k-1]``. So the weights the harness hashed after update k are the ones rollout k+1 says it
  sampled with; what a rollout used inside the process is the one fact only the product can report.
* ``grouped_trajectory_identity``: per engine (and vllm where accepted) and cycle, ``prompts_per_cycle`` groups of
  ``samples_per_prompt``
  trajectories; a group's trajectories share ``group_id``, ``prompt_id``, prompt tokens and ``policy_version``
  (the updates before the cycle, as its metrics line says); sample indices 0..n-1 once each; group ids distinct
  across every group of the run;
* ``vllm_boundary``: judged only on evidence of a real vLLM run. Where the plan was accepted, the run must meet
  the vLLM evidence contract (:data:`VLLM_TRAJECTORY_FIELDS`, which the product's vLLM rollout path must write,
  issue #32) on every cycle: the plan it ran names ``rollout.backend: vllm``; the run completed its
  ``scale.policy_refreshes`` GRPO updates; every metrics
  line says ``rollout_backend`` ``vllm`` and ``actor/old_logp_recomputed`` 1.0; every trajectory carries
  ``rollout_backend`` ``vllm``, the engine's own ``rollout_backend_version`` (``vllm.__version__``, one version
  for the run, and the one the run's interpreter has installed: ``engine.json``, which the harness writes from
  that interpreter's own package metadata before the run), and per response token both the sampler's
  ``sampled_logprobs`` and the trainer's recomputed ``old_logprobs``. The judge compares them itself: they must
  differ somewhere by more than
  :data:`VLLM_MIN_LOGP_DIFFERENCE` (equal log-probs are the trainer's own, not a foreign engine's), and each
  metrics line's ``actor/old_logp_max_abs_diff`` must be the judge's own maximum over that cycle's tokens
  (within :data:`VLLM_DIFF_AGREEMENT`), which binds the metrics to those trajectories. ``old_logp_recomputed``
  alone never passes it: every in-process line carries it. Where vllm is absent, ``plan`` must refuse
  ``rollout.backend: vllm`` with exactly one stderr line naming that vllm is not installed, and write no plan;
  that refusal is kept as evidence, but it measures nothing about vLLM's policy-gradient boundary, so the check
  is ``not_applicable`` with the reason (never "passed"; the policy fails the level where it requires the
  check). Any other outcome (a traceback, a timeout, a plan written without a run, another reason) fails it: a
  crash is not a boundary.

The layout (sizes, roles, archive members, the contract's names) is :mod:`harness.qualify.full.refresh_layout`; the
per-run judges of the first two checks are :mod:`harness.qualify.full.refresh_chain`, the third's
:mod:`harness.qualify.full.refresh_vllm`. This module runs the refreshes, decides the three checks, and re-exports the
names its importers use. Torch-free and miniverl-free, like all of the harness.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from harness.core.proc import clean_env, run
from harness.core.records import CheckpointHashes, Profile
from harness.qualify.full import runs, statehash
from harness.qualify.full.base import Context, Judgement, Scale, WorkloadFailure
from harness.qualify.full.reading import read_json
from harness.qualify.full.refresh_chain import groups_of, refreshes_of
from harness.qualify.full.refresh_layout import (
    ADAPTER,
    ENGINES,
    MAX_REFRESHES,
    OLD_LOGP_MAX_ABS_DIFF,
    OLD_LOGP_RECOMPUTED,
    REFRESH_EVIDENCE,
    REFRESH_RUNS,
    REFRESH_SIZES,
    ROOT,
    RUN_OUTPUT,
    VLLM_ABSENT_REASON,
    VLLM_BACKEND,
    VLLM_DIFF_AGREEMENT,
    VLLM_MIN_LOGP_DIFFERENCE,
    VLLM_REFUSAL_PREFIX,
    VLLM_TRAJECTORY_FIELDS,
    WORKLOADS,
    YAML,
    checkpoint_role,
    trajectory_role,
)
from harness.qualify.full.refresh_vllm import judge_vllm_boundary, vllm_accepted, vllm_cycle
from harness.qualify.transcript import CliDriver, CliResult

__all__ = [
    "ADAPTER",
    "ENGINES",
    "MAX_REFRESHES",
    "OLD_LOGP_MAX_ABS_DIFF",
    "OLD_LOGP_RECOMPUTED",
    "REFRESH_EVIDENCE",
    "REFRESH_RUNS",
    "REFRESH_SIZES",
    "ROOT",
    "RUN_OUTPUT",
    "VLLM_ABSENT_REASON",
    "VLLM_BACKEND",
    "VLLM_DIFF_AGREEMENT",
    "VLLM_MIN_LOGP_DIFFERENCE",
    "VLLM_REFUSAL_PREFIX",
    "VLLM_TRAJECTORY_FIELDS",
    "WORKLOADS",
    "YAML",
    "judge_refreshes",
    "run_refreshes",
    "run_vllm",
    "vllm_cycle",
]

# The private names scripts/device/vllm_smoke.py and the tests reach the vLLM judges by, from before the split.
_vllm_cycle = vllm_cycle
_vllm = judge_vllm_boundary


# ---------------------------------------------------------------------------------------------------- run
def _sizes(scale: Scale, cycles: int) -> list[str]:
    values = [f"train.cycles={cycles}", *(f"rollout.{key}={value}" for key, value in REFRESH_SIZES.items())]
    if scale.quantization is not None:
        values.append(f"models.student.quantization={scale.quantization}")
    return [arg for value in values for arg in ("--set", value)]


def _plan(ctx: Context, step: str, out: str, extra: list[str], cycles: int) -> CliResult:
    args = ["plan", YAML, *ctx.scale.overrides(), *_sizes(ctx.scale, cycles), *extra, "--out", out, "--json"]
    return ctx.cli(step, args, timeout=600)


def _run(ctx: Context, step: str, plan: str, run_id: str) -> Path:
    ctx.cli(step, ["run", "--plan", plan, "--output", RUN_OUTPUT, "--run-id", run_id, "--json"], timeout=3600)
    return ctx.work / RUN_OUTPUT / run_id


def _redact(value: Any, cli: CliDriver) -> Any:
    if isinstance(value, str):
        return cli.redact.text(value)
    if isinstance(value, dict):
        return {str(k): _redact(v, cli) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, cli) for v in value]
    return value


def _keep(found: dict[str, Path], role: str, path: Path) -> None:
    if path.is_file():
        found[role] = path


def _lora_b_only(taken: statehash.Taken | None) -> statehash.Taken | None:
    """Update 1's hashes with only the adapter's lora_B tensor digests (all the judge reads of them: whether
    update 1 moved one off its all-zero init; the full table would be 80 kB per engine)."""
    if not isinstance(taken, CheckpointHashes):
        return taken
    tables = {f: {n: t for n, t in table.items() if "lora_B" in n} for f, table in taken.tensors.items()}
    return taken.model_copy(update={"tensors": tables})


def _hash_checkpoints(ctx: Context, engine: str, run_dir: Path, cycles: int) -> Path:
    """The harness's own sha256 of every update's checkpoint, taken now (the work dir goes after the run)."""
    taken: dict[str, statehash.Taken | None] = {}
    for cycle in range(1, cycles + 1):
        directory = runs.checkpoint_json(run_dir, cycle).parent
        hashed = statehash.take(directory, tensors=cycle == 1)
        taken[checkpoint_role(engine, cycle)] = _lora_b_only(hashed) if cycle == 1 else hashed
    return statehash.write_taken(ctx.work / f"refresh-{engine}-state-hashes.json", taken)


def _keep_run(ctx: Context, found: dict[str, Path], engine: str, run_dir: Path, cycles: int) -> None:
    """Keep a refresh run's summary, metrics, trajectories and checkpoints, and the harness's hashes of them."""
    _keep(found, f"refresh_{engine}_summary", run_dir / "summary.json")
    _keep(found, f"refresh_{engine}_metrics", run_dir / "metrics.jsonl")
    for cycle in range(1, cycles + 1):
        _keep(found, trajectory_role(engine, cycle), run_dir / "trajectories" / f"cycle-{cycle:06d}.jsonl")
        _keep(found, checkpoint_role(engine, cycle), runs.checkpoint_json(run_dir, cycle))
    found[f"refresh_{engine}_state_hashes"] = _hash_checkpoints(ctx, engine, run_dir, cycles)


def run_refreshes(ctx: Context) -> dict[str, Path]:
    """The refresh runs per engine, the vllm plan probe and (where it was accepted) the same refresh run on vllm;
    returns the evidence files they produced."""
    cycles = ctx.scale.policy_refreshes
    if not 1 <= cycles <= MAX_REFRESHES:
        raise WorkloadFailure(f"scale {ctx.scale.name} asks for {cycles} policy refreshes; the layout holds 1..8")
    shutil.copyfile(WORKLOADS / YAML, ctx.work / YAML)
    found: dict[str, Path] = {}
    for engine in ENGINES:
        plan = f"plan-refresh-{engine}.json"
        if not _plan(ctx, f"refresh_{engine}_plan", plan, ["--set", f"rollout.engine={engine}"], cycles).ok:
            continue
        _keep(found, f"refresh_{engine}_plan", ctx.work / plan)
        _keep_run(ctx, found, engine, _run(ctx, f"refresh_{engine}_run", plan, f"refresh-{engine}"), cycles)
    found.update(run_vllm(ctx, cycles))
    return found


def run_vllm(ctx: Context, cycles: int) -> dict[str, Path]:
    """The vLLM boundary's evidence: the plan must refuse where vllm is absent, and is run like the engines' where
    accepted (``ctx.work`` must hold :data:`YAML`)."""
    found: dict[str, Path] = {}
    plan = "plan-refresh-vllm.json"
    result = _plan(ctx, "refresh_vllm_plan", plan, ["--set", "rollout.backend=vllm"], cycles)
    inv = result.invocation
    stderr = result.stderr.decode("utf-8", errors="replace")
    probe = {
        "step": inv.step,
        "argv": inv.argv,
        "exit_code": inv.exit_code,
        "timed_out": inv.timed_out,
        "stderr_last_line": inv.stderr_last_line,
        "stderr_lines": sum(1 for line in stderr.splitlines() if line.strip()),
        "stdout_json": _redact(result.json(), ctx.cli),
        "plan_written": (ctx.work / plan).exists(),
    }
    probe_path = ctx.work / "refresh-vllm-plan-result.json"
    probe_path.write_text(json.dumps(probe, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    found["refresh_vllm_plan"] = probe_path
    if result.ok:
        found["refresh_vllm_engine"] = _installed_vllm(ctx)
        _keep(found, "refresh_vllm_run_plan", ctx.work / plan)
        _keep_run(ctx, found, VLLM_BACKEND, _run(ctx, "refresh_vllm_run", plan, "refresh-vllm"), cycles)
    return found


#: run by the venv's interpreter in the CLI's environment: which vllm distribution it would import (vllm itself is
#: never imported: that would build nothing here but take seconds and a CUDA context)
_INSTALLED_VLLM = (
    "import importlib.metadata as m, importlib.util as u, json; spec = u.find_spec('vllm'); "
    "print(json.dumps({'vllm_version': m.version('vllm'), 'vllm_importable': spec is not None}))"
)


def _installed_vllm(ctx: Context) -> Path:
    """``engine.json``: the vllm version the run's interpreter finds installed, read by the harness from the venv's
    own metadata (the version the trajectories must name), with the exit code and last stderr line where it could
    not be read."""
    python = ctx.cli.venv / "bin" / "python"
    env = clean_env(ctx.cli.extra_env, path_prefix=ctx.cli.venv / "bin")
    try:
        done = run([str(python), "-c", _INSTALLED_VLLM], cwd=ctx.work, env=env, timeout=120)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 124, b"", b"timed out after 120 s")
    except OSError as exc:  # no interpreter where the venv should hold one
        done = subprocess.CompletedProcess([], 127, b"", f"{python.name}: {exc.strerror}".encode())
    try:
        doc = json.loads(done.stdout.decode("utf-8")) if done.returncode == 0 else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    lines = done.stderr.decode("utf-8", errors="replace").strip().splitlines()
    doc.update(exit_code=done.returncode, stderr_last_line=ctx.cli.redact.text(lines[-1])[:300] if lines else "")
    path = ctx.work / "refresh-vllm-engine.json"
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------- judge
def judge_refreshes(evidence: dict[str, Path], judgement: Judgement, profile: Profile, scale: Scale) -> None:
    """Decide ``policy_refreshes``, ``grouped_trajectory_identity`` and ``vllm_boundary`` from the files only (the
    last may be ``not_applicable``: whether that fails the level is the policy's, per profile)."""
    del profile  # the same judgement on every profile
    cycles = scale.policy_refreshes
    judgement.metrics["refresh_cycles_per_engine"] = cycles
    if not 1 <= cycles <= MAX_REFRESHES:
        judgement.check("policy_refreshes", False, f"the scale asks for {cycles} refreshes; the layout holds 1..8")
        judgement.check("grouped_trajectory_identity", False, "no evidence layout for this scale")
        judge_vllm_boundary(evidence, judgement, cycles)
        return
    # vllm's refresh run is judged where the plan accepted vllm; where it refused, vllm_boundary says why
    engines = REFRESH_RUNS if vllm_accepted(read_json(evidence.get("refresh_vllm_plan"))) else ENGINES
    refreshes = [refreshes_of(engine, evidence, scale) for engine in engines]
    for engine, (ok, _) in zip(engines, refreshes, strict=True):
        judgement.metrics[f"refresh_{engine}_chain_ok"] = ok
    judgement.check("policy_refreshes", all(ok for ok, _ in refreshes), "; ".join(d for _, d in refreshes))
    grouped = [groups_of(engine, evidence, scale) for engine in engines]
    judgement.check("grouped_trajectory_identity", all(ok for ok, _ in grouped), "; ".join(d for _, d in grouped))
    judge_vllm_boundary(evidence, judgement, cycles)
