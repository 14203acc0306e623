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

Torch-free and miniverl-free, like all of the harness.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from harness.core.proc import HARNESS_DIR, clean_env, run
from harness.core.records import SHA256_HEX, CheckpointHashes, Profile
from harness.qualify.full import runs, statehash
from harness.qualify.full.base import Context, Judgement, Scale, WorkloadFailure
from harness.qualify.full.reading import count, finite, read_json, read_jsonl
from harness.qualify.transcript import CliDriver, CliResult

WORKLOADS = HARNESS_DIR / "workloads"
YAML = "refresh-grpo.yaml"
ENGINES = ("fast", "hf")
#: the most refreshes an evidence layout declares (every scale asks for 8)
MAX_REFRESHES = 8
ROOT = "v011/backend-matrix/refresh"
RUN_OUTPUT = "refresh-runs"
ADAPTER = runs.ADAPTER

#: the one line ``miniverl plan`` must refuse ``rollout.backend: vllm`` with where vllm is absent
VLLM_REFUSAL_PREFIX = "miniverl: error: rollout.backend vllm: "
VLLM_ABSENT_REASON = "vllm is not installed"
#: the algorithm_metrics key a policy-gradient update sets to 1.0 when the trainer recomputed old_logp
OLD_LOGP_RECOMPUTED = "actor/old_logp_recomputed"
#: the algorithm_metrics key a vLLM run reports: max |sampled_logprobs - old_logprobs| over the cycle's tokens
OLD_LOGP_MAX_ABS_DIFF = "actor/old_logp_max_abs_diff"
VLLM_BACKEND = "vllm"
#: every refresh chain the layout declares: the in-process engines, then the vLLM backend (run where accepted)
REFRESH_RUNS = (*ENGINES, VLLM_BACKEND)
#: what every trajectory of a vLLM run must carry (the contract issue #32's vLLM rollout path must meet)
VLLM_TRAJECTORY_FIELDS = {
    "rollout_backend": "the literal 'vllm': the engine that sampled it",
    "rollout_backend_version": "vllm.__version__ of the engine that sampled it (one version for the run)",
    "sampled_logprobs": "the sampler's log-prob of each response token, as vLLM returned it",
    "old_logprobs": "the trainer's recomputed log-prob of each response token under the rollout's weights",
}
#: a foreign engine's log-probs differ from the trainer's somewhere by more than this (equal ones are the trainer's)
VLLM_MIN_LOGP_DIFFERENCE = 1e-6
#: the metrics line's max |sampled - old| must be the judge's own, within this
VLLM_DIFF_AGREEMENT = 1e-6

_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+[0-9A-Za-z.+-]*")


def _trajectory_role(engine: str, cycle: int) -> str:
    return f"refresh_{engine}_trajectories_{cycle}"


def _checkpoint_role(engine: str, cycle: int) -> str:
    """The evidence role of update ``cycle``'s kept checkpoint.json, and its label in the engine's state hashes."""
    return f"refresh_{engine}_checkpoint_{cycle}"


def _plan_role(engine: str) -> str:
    """The role of the plan a refresh run ran (for vllm ``refresh_vllm_plan`` is the probe's result)."""
    return "refresh_vllm_run_plan" if engine == VLLM_BACKEND else f"refresh_{engine}_plan"


def _evidence() -> dict[str, str]:
    members: dict[str, str] = {}
    members["refresh_vllm_plan"] = f"{ROOT}/vllm/plan-result.json"
    members["refresh_vllm_engine"] = f"{ROOT}/vllm/engine.json"
    for engine in REFRESH_RUNS:
        members[_plan_role(engine)] = f"{ROOT}/{engine}/plan.json"
        members[f"refresh_{engine}_summary"] = f"{ROOT}/{engine}/summary.json"
        members[f"refresh_{engine}_metrics"] = f"{ROOT}/{engine}/metrics.jsonl"
        members[f"refresh_{engine}_state_hashes"] = f"{ROOT}/{engine}/state-hashes.json"
        for cycle in range(1, MAX_REFRESHES + 1):
            members[_trajectory_role(engine, cycle)] = f"{ROOT}/{engine}/trajectories/cycle-{cycle:06d}.jsonl"
            members[_checkpoint_role(engine, cycle)] = f"{ROOT}/{engine}/checkpoints/checkpoint-{cycle}.json"
    return members


#: role -> archive member of every file :func:`run_refreshes` may return
REFRESH_EVIDENCE: dict[str, str] = _evidence()


# The rollout sizes of every refresh run, on every profile (declared here, recorded in the plan, judged).
REFRESH_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 4, "max_new_tokens": 16}


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
        taken[_checkpoint_role(engine, cycle)] = _lora_b_only(hashed) if cycle == 1 else hashed
    return statehash.write_taken(ctx.work / f"refresh-{engine}-state-hashes.json", taken)


def _keep_run(ctx: Context, found: dict[str, Path], engine: str, run_dir: Path, cycles: int) -> None:
    """Keep a refresh run's summary, metrics, trajectories and checkpoints, and the harness's hashes of them."""
    _keep(found, f"refresh_{engine}_summary", run_dir / "summary.json")
    _keep(found, f"refresh_{engine}_metrics", run_dir / "metrics.jsonl")
    for cycle in range(1, cycles + 1):
        _keep(found, _trajectory_role(engine, cycle), run_dir / "trajectories" / f"cycle-{cycle:06d}.jsonl")
        _keep(found, _checkpoint_role(engine, cycle), runs.checkpoint_json(run_dir, cycle))
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
def _digest(line: dict[str, Any], key: str) -> str | None:
    value = line.get(key)
    return value if isinstance(value, str) and SHA256_HEX.match(value) else None


def _completed_grpo(summary: dict[str, Any] | None, updates: int) -> str | None:
    """Why ``summary`` is not a completed GRPO run of ``updates`` updates (None: it is)."""
    if summary is None:
        return "no readable summary.json (the run failed or did not run)"
    if summary.get("status") != "completed" or summary.get("algorithm") != "grpo":
        return f"run status {summary.get('status')!r}, algorithm {summary.get('algorithm')!r}"
    if count(summary.get("updates")) != updates:
        return f"{summary.get('updates')!r} updates, {updates} asked for"
    return None


def _rollout_config(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    config = plan.get("config") if plan is not None else None
    rollout = config.get("rollout") if isinstance(config, dict) else None
    return rollout if isinstance(rollout, dict) else None


def _product_chain(where: str, lines: list[dict[str, Any]], engine: str) -> tuple[list[str], str | None]:
    """The product's digests after each update, provided they chain (else why not)."""
    afters: list[str] = []
    previous_after: str | None = None
    for k, line in enumerate(lines, start=1):
        at = f"{where} step {k}"
        if count(line.get("step")) != k or count(line.get("policy_version")) != k - 1:
            return afters, f"{at}: line says step {line.get('step')!r}, policy_version {line.get('policy_version')!r}"
        if line.get("rollout_backend") != engine:
            return afters, f"{at}: rollout_backend {line.get('rollout_backend')!r}, asked for {engine!r}"
        rollout_d, before, after = (_digest(line, f"policy_digest_{s}") for s in ("rollout", "before", "after"))
        if rollout_d is None or before is None or after is None:
            return afters, f"{at}: a policy digest is missing or not sha256 hex"
        if rollout_d != before:
            return afters, f"{at}: policy_digest_rollout {rollout_d[:12]} != policy_digest_before {before[:12]}"
        if previous_after is not None and before != previous_after:
            return afters, f"{at}: policy_digest_before {before[:12]} != step {k - 1}'s after {previous_after[:12]}"
        previous_after = after
        afters.append(after)
    return afters, None


def _harness_states(where: str, engine: str, evidence: dict[str, Path], cycles: int) -> tuple[list[str], str | None]:
    """The harness's sha256 of the adapter after each update, provided every update's checkpoint was hashed by
    the harness as that update's, its kept checkpoint.json states the harness's digests and commits the kept
    trajectories, and every update changed the adapter (else why not)."""
    hashes = statehash.read_state_hashes(evidence.get(f"refresh_{engine}_state_hashes"))
    if hashes is None:
        return [], f"{where}: state-hashes.json missing or not a harness state-hashes record"
    adapters: list[str] = []
    for k in range(1, cycles + 1):
        at, role = f"{where} update {k}", _checkpoint_role(engine, k)
        found, why = statehash.checkpoint(hashes, role)
        if found is None:
            return adapters, f"{at}: {why}"
        listed = read_json(evidence.get(role)) or {}
        if found.step != k or count(listed.get("step")) != k:
            return adapters, f"{at}: the harness hashed step {found.step}, the kept checkpoint.json says " + (
                f"{listed.get('step')!r} (a swapped or misplaced checkpoint)"
            )
        agrees, why = statehash.product_agrees(hashes, role, evidence.get(role))
        if not agrees:
            return adapters, f"{at}: {why}"
        committed, why = runs.trajectories_committed(
            evidence, role, [_trajectory_role(engine, c) for c in range(1, k + 1)]
        )
        if not committed:
            return adapters, f"{at}: {why} (hashes of another run or engine)"
        adapter = found.files.get(ADAPTER)
        if adapter is None:
            return adapters, f"{at}: the harness hashed no {ADAPTER}"
        if adapters and adapter.sha256 == adapters[-1]:
            return adapters, f"{at}: the harness's sha256 of the adapter did not change (the update changed nothing)"
        adapters.append(adapter.sha256)
    moved, why = statehash.adapter_moved(hashes, None, _checkpoint_role(engine, 1), ADAPTER)
    return adapters, None if moved else f"{where} update 1: {why}"


def _refreshes_of(engine: str, evidence: dict[str, Path], scale: Scale) -> tuple[bool, str]:
    """One engine's refresh chain: (passed, detail naming the engine and the first bad step)."""
    where = f"engine {engine}"
    cycles = scale.policy_refreshes
    summary = read_json(evidence.get(f"refresh_{engine}_summary"))
    why = _completed_grpo(summary, cycles)
    if why is not None:
        return False, f"{where}: {why}"
    plan = read_json(evidence.get(_plan_role(engine)))
    rollout = _rollout_config(plan)
    if engine == VLLM_BACKEND:
        if rollout is None or rollout.get("backend") != VLLM_BACKEND:
            return False, f"{where}: the plan does not ask for rollout.backend vllm"
    elif rollout is None or rollout.get("engine") != engine or rollout.get("backend") != "hf":
        return False, f"{where}: the plan does not ask for rollout.backend hf with rollout.engine {engine}"
    other = [f"{k} {rollout.get(k)!r} (declared {v})" for k, v in REFRESH_SIZES.items() if count(rollout.get(k)) != v]
    if other:
        return False, f"{where}: the plan's rollout sizes are not the declared refresh sizes: {', '.join(other)}"
    config = plan.get("config") if plan is not None else None
    models = config.get("models") if isinstance(config, dict) else None
    student = models.get("student") if isinstance(models, dict) else None
    quantization = student.get("quantization") if isinstance(student, dict) else None
    if quantization != (scale.quantization or "none"):
        return False, f"{where}: the plan's student quantization {quantization!r} is not the scale's"
    lines = read_jsonl(evidence.get(f"refresh_{engine}_metrics"))
    if lines is None:
        return False, f"{where}: metrics.jsonl missing or not strict JSON lines"
    if len(lines) != cycles:
        return False, f"{where}: {len(lines)} metrics lines for {cycles} updates"
    afters, why = _product_chain(where, lines, engine)
    if why is not None:
        return False, why
    adapters, why = _harness_states(where, engine, evidence, cycles)
    if why is not None:
        return False, why
    initial = _digest(lines[0], "policy_digest_before")
    for j in range(cycles):
        if afters[j] == initial:
            return False, f"{where} step {j + 1}: policy_digest_after equals the initial weights' digest"
        for k in range(j + 1, cycles):
            if (afters[j] == afters[k]) != (adapters[j] == adapters[k]):
                return False, (
                    f"{where} steps {j + 1} and {k + 1}: the product's policy digests and the harness's adapter "
                    "sha256 do not name the same weights"
                )
    return True, (
        f"{where}: {cycles} updates; by the harness's own hashes every update changed the adapter, each kept "
        "checkpoint commits this run's trajectories, and the product's digests name those states one to one and "
        "chain (every rollout used the weights the previous update left)"
    )


def _trajectory_fields(record: dict[str, Any]) -> tuple[str, str, int, int, tuple[int, ...]] | None:
    group, prompt = record.get("group_id"), record.get("prompt_id")
    index, version = count(record.get("sample_index")), count(record.get("policy_version"))
    tokens = record.get("prompt_token_ids")
    if not isinstance(group, str) or not group or not isinstance(prompt, str) or not prompt:
        return None
    if index is None or version is None or not isinstance(tokens, list) or not tokens:
        return None
    if any(count(t) is None for t in tokens):
        return None
    return group, prompt, index, version, tuple(tokens)


def _groups_of(engine: str, evidence: dict[str, Path], scale: Scale) -> tuple[bool, str]:
    where = f"engine {engine}"
    cycles = scale.policy_refreshes
    per_group, groups_per_cycle = REFRESH_SIZES["samples_per_prompt"], REFRESH_SIZES["prompts_per_cycle"]
    seen_groups: set[str] = set()
    lines = read_jsonl(evidence.get(f"refresh_{engine}_metrics")) or []
    for cycle in range(1, cycles + 1):
        at = f"{where} cycle {cycle}"
        records = read_jsonl(evidence.get(_trajectory_role(engine, cycle)))
        if records is None:
            return False, f"{at}: trajectories file missing or not strict JSON lines"
        if len(records) != groups_per_cycle * per_group:
            return False, f"{at}: {len(records)} trajectories, expected {groups_per_cycle} x {per_group}"
        version = cycle - 1
        if len(lines) >= cycle and count(lines[cycle - 1].get("policy_version")) != version:
            return False, f"{at}: the metrics line's policy_version is not {version}"
        groups: dict[str, list[tuple[str, str, int, int, tuple[int, ...]]]] = {}
        for number, record in enumerate(records, start=1):
            fields = _trajectory_fields(record)
            if fields is None:
                return False, f"{at} line {number}: group_id, prompt_id, sample_index, policy_version or prompt missing"
            groups.setdefault(fields[0], []).append(fields)
        if len(groups) != groups_per_cycle:
            return False, f"{at}: {len(groups)} groups, expected {groups_per_cycle}"
        for group_id, members in sorted(groups.items()):
            if group_id in seen_groups:
                return False, f"{at}: group_id {group_id!r} also names a group of an earlier cycle"
            seen_groups.add(group_id)
            if len({(m[1], m[4]) for m in members}) != 1:
                return False, f"{at}: group {group_id!r} mixes prompts"
            versions = {m[3] for m in members}
            if versions != {version}:
                return False, f"{at}: group {group_id!r} has policy_version {sorted(versions)}, expected {version}"
            indices = sorted(m[2] for m in members)
            if indices != list(range(per_group)):
                return False, f"{at}: group {group_id!r} sample indices {indices} (duplicated or missing trajectories)"
    return True, (
        f"{where}: {cycles} cycles x {groups_per_cycle} groups x {per_group} trajectories, each group one prompt and "
        "one policy version, indices complete, group ids distinct"
    )


def _logprobs(record: dict[str, Any], key: str, tokens: int) -> list[float] | None:
    values = record.get(key)
    if not isinstance(values, list) or len(values) != tokens:
        return None
    out = [finite(v) for v in values]
    return None if any(v is None for v in out) else [v for v in out if v is not None]


def _vllm_cycle(cycle: int, line: dict[str, Any], records: list[dict[str, Any]] | None) -> tuple[str | None, str]:
    """Why one vLLM cycle's trajectories and metrics line do not meet the contract (None: they do), and the
    engine's version."""
    at = f"vllm cycle {cycle}"
    if not records:
        return f"{at}: trajectories missing, empty or not strict JSON lines", ""
    if count(line.get("trajectories")) != len(records):
        return f"{at}: the metrics line counts {line.get('trajectories')!r} trajectories, {len(records)} kept", ""
    versions: set[str] = set()
    largest = 0.0
    for number, record in enumerate(records, start=1):
        here = f"{at} trajectory {number}"
        if record.get("rollout_backend") != VLLM_BACKEND:
            return f"{here}: rollout_backend {str(record.get('rollout_backend'))[:40]!r}, not {VLLM_BACKEND!r}", ""
        version = record.get("rollout_backend_version")
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            return f"{here}: no rollout_backend_version (vllm.__version__)", ""
        versions.add(version)
        tokens = record.get("response_token_ids")
        if not isinstance(tokens, list) or not tokens:
            return f"{here}: no response tokens", ""
        sampled = _logprobs(record, "sampled_logprobs", len(tokens))
        old = _logprobs(record, "old_logprobs", len(tokens))
        if sampled is None or old is None:
            return f"{here}: sampled_logprobs and old_logprobs must be one finite value per response token", ""
        largest = max([largest, *(abs(s - o) for s, o in zip(sampled, old, strict=True))])
    if len(versions) != 1:
        return f"{at}: trajectories name vllm versions {sorted(versions)[:4]}", ""
    if largest <= VLLM_MIN_LOGP_DIFFERENCE:
        return (
            f"{at}: the sampler's log-probs equal the trainer's recomputed ones (max |diff| {largest:.3g}): the "
            "trainer's own numbers, not a foreign engine's"
        ), ""
    metrics = line.get("algorithm_metrics")
    stated = finite(metrics.get(OLD_LOGP_MAX_ABS_DIFF)) if isinstance(metrics, dict) else None
    if stated is None or abs(stated - largest) > VLLM_DIFF_AGREEMENT:
        return f"{at}: {OLD_LOGP_MAX_ABS_DIFF} {stated!r}, the judge's own from the trajectories {largest:.9g}", ""
    return None, versions.pop()


def _vllm_run(evidence: dict[str, Path], probe: dict[str, Any], cycles: int) -> tuple[str | None, str]:
    """Why the accepted vLLM plan's run is not evidence of a real vLLM run (None: it is), and vllm's version."""
    if probe.get("plan_written") is not True:
        return "plan exited 0 but wrote no plan", ""
    rollout = _rollout_config(read_json(evidence.get("refresh_vllm_run_plan")))
    if rollout is None or rollout.get("backend") != VLLM_BACKEND:
        return "the kept plan does not name rollout.backend vllm", ""
    why = _completed_grpo(read_json(evidence.get("refresh_vllm_summary")), cycles)
    if why is not None:
        return f"the vllm run: {why}", ""
    lines = read_jsonl(evidence.get("refresh_vllm_metrics"))
    if lines is None or len(lines) != cycles:
        return f"the vllm run's metrics.jsonl is missing or unreadable or not {cycles} lines", ""
    versions: list[str] = []
    for cycle, line in enumerate(lines, start=1):
        at = f"vllm step {cycle}"
        metrics = line.get("algorithm_metrics")
        if count(line.get("step")) != cycle or line.get("rollout_backend") != VLLM_BACKEND:
            return f"{at}: step {line.get('step')!r}, rollout_backend {str(line.get('rollout_backend'))[:40]!r}", ""
        if not isinstance(metrics, dict) or finite(metrics.get(OLD_LOGP_RECOMPUTED)) != 1.0:
            return f"{at}: no {OLD_LOGP_RECOMPUTED}=1 (the trainer did not recompute old_logp)", ""
        why, version = _vllm_cycle(cycle, line, read_jsonl(evidence.get(_trajectory_role(VLLM_BACKEND, cycle))))
        if why is not None:
            return why, ""
        versions.append(version)
    if len(set(versions)) != 1:
        return f"the run's cycles name vllm versions {sorted(set(versions))[:4]} (one engine samples a run)", ""
    version = versions[0]
    engine = read_json(evidence.get("refresh_vllm_engine"))
    installed = engine.get("vllm_version") if engine is not None else None
    if engine is None or engine.get("vllm_importable") is not True or not isinstance(installed, str):
        return "no engine.json naming the vllm the run's interpreter has installed (read by the harness)", ""
    if installed != version:
        return (
            f"the trajectories name vllm {version[:40]!r}; the run's interpreter has vllm {installed[:40]!r} "
            "installed (its own metadata, read by the harness)"
        ), ""
    return None, version


def _vllm_accepted(probe: dict[str, Any] | None) -> bool:
    """``miniverl plan`` accepted ``rollout.backend: vllm`` (vllm importable): its run is then judged like the
    engines' and must meet the contract; anything else is the boundary's to judge (refusal or failure)."""
    return probe is not None and count(probe.get("exit_code")) == 0 and probe.get("timed_out") is False


def _vllm(evidence: dict[str, Path], judgement: Judgement, cycles: int) -> None:
    probe = read_json(evidence.get("refresh_vllm_plan"))
    if probe is None:
        judgement.metrics["vllm_backend"] = "failed"
        judgement.check("vllm_boundary", False, "no readable result of `miniverl plan` with rollout.backend=vllm")
        return
    code, line = probe.get("exit_code"), probe.get("stderr_last_line")
    line = line if isinstance(line, str) else ""
    if _vllm_accepted(probe):
        # vllm was importable and the plan accepted it: only the run's own evidence of vLLM can pass the check
        why, version = _vllm_run(evidence, probe, cycles)
        judgement.metrics["vllm_backend"] = "passed" if why is None else "failed"
        if why is None:
            judgement.metrics["vllm_version"] = version
        judgement.check(
            "vllm_boundary",
            why is None,
            f"vllm accepted: {why}"
            if why is not None
            else f"vllm {version} sampled every trajectory of {cycles} cycles; the trainer recomputed old_logp on "
            "every update and its log-probs differ from the sampler's, as the metrics state",
        )
        return
    refused = (
        count(code) is not None
        and code != 0
        and probe.get("timed_out") is False
        and probe.get("plan_written") is False
        and count(probe.get("stderr_lines")) == 1
        and line.startswith(VLLM_REFUSAL_PREFIX)
        and VLLM_ABSENT_REASON in line
    )
    reason = line[len("miniverl: error: ") :] if line.startswith("miniverl: error: ") else line
    judgement.metrics["vllm_backend"] = "not_run" if refused else "failed"
    judgement.metrics["vllm_backend_reason"] = reason[:300]
    if refused:
        judgement.not_applicable(
            "vllm_boundary",
            f"{VLLM_ABSENT_REASON}: plan refused rollout.backend=vllm (exit {code}) in one line ({reason[:200]}); "
            "nothing about vLLM's policy-gradient boundary was measured",
        )
        return
    judgement.check(
        "vllm_boundary",
        False,
        f"plan with rollout.backend=vllm: exit {code!r}, timed out {probe.get('timed_out')!r}, plan written "
        f"{probe.get('plan_written')!r}, {probe.get('stderr_lines')!r} stderr lines, last {line[:200]!r} (expected "
        f"a one-line refusal naming that {VLLM_ABSENT_REASON}, or the plan accepted where vllm is installed)",
    )


def judge_refreshes(evidence: dict[str, Path], judgement: Judgement, profile: Profile, scale: Scale) -> None:
    """Decide ``policy_refreshes``, ``grouped_trajectory_identity`` and ``vllm_boundary`` from the files only (the
    last may be ``not_applicable``: whether that fails the level is the policy's, per profile)."""
    del profile  # the same judgement on every profile
    cycles = scale.policy_refreshes
    judgement.metrics["refresh_cycles_per_engine"] = cycles
    if not 1 <= cycles <= MAX_REFRESHES:
        judgement.check("policy_refreshes", False, f"the scale asks for {cycles} refreshes; the layout holds 1..8")
        judgement.check("grouped_trajectory_identity", False, "no evidence layout for this scale")
        _vllm(evidence, judgement, cycles)
        return
    # vllm's refresh run is judged where the plan accepted vllm; where it refused, vllm_boundary says why
    engines = REFRESH_RUNS if _vllm_accepted(read_json(evidence.get("refresh_vllm_plan"))) else ENGINES
    refreshes = [_refreshes_of(engine, evidence, scale) for engine in engines]
    for engine, (ok, _) in zip(engines, refreshes, strict=True):
        judgement.metrics[f"refresh_{engine}_chain_ok"] = ok
    judgement.check("policy_refreshes", all(ok for ok, _ in refreshes), "; ".join(d for _, d in refreshes))
    grouped = [_groups_of(engine, evidence, scale) for engine in engines]
    judgement.check("grouped_trajectory_identity", all(ok for ok, _ in grouped), "; ".join(d for _, d in grouped))
    _vllm(evidence, judgement, cycles)
