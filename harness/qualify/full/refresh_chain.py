"""The judges of ``policy_refreshes`` and ``grouped_trajectory_identity`` for one refresh run (an in-process engine,
or vLLM where its plan was accepted), from its kept files and the harness's own state hashes only; see
:mod:`harness.qualify.full.refresh` for what each check requires."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core.records import SHA256_HEX
from harness.qualify.full import runs, statehash
from harness.qualify.full.base import Scale
from harness.qualify.full.reading import count, read_json, read_jsonl
from harness.qualify.full.refresh_layout import (
    ADAPTER,
    REFRESH_SIZES,
    VLLM_BACKEND,
    checkpoint_role,
    plan_role,
    trajectory_role,
)


def _digest(line: dict[str, Any], key: str) -> str | None:
    value = line.get(key)
    return value if isinstance(value, str) and SHA256_HEX.match(value) else None


def completed_grpo(summary: dict[str, Any] | None, updates: int) -> str | None:
    """Why ``summary`` is not a completed GRPO run of ``updates`` updates (None: it is)."""
    if summary is None:
        return "no readable summary.json (the run failed or did not run)"
    if summary.get("status") != "completed" or summary.get("algorithm") != "grpo":
        return f"run status {summary.get('status')!r}, algorithm {summary.get('algorithm')!r}"
    if count(summary.get("updates")) != updates:
        return f"{summary.get('updates')!r} updates, {updates} asked for"
    return None


def rollout_config(plan: dict[str, Any] | None) -> dict[str, Any] | None:
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
        at, role = f"{where} update {k}", checkpoint_role(engine, k)
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
            evidence, role, [trajectory_role(engine, c) for c in range(1, k + 1)]
        )
        if not committed:
            return adapters, f"{at}: {why} (hashes of another run or engine)"
        adapter = found.files.get(ADAPTER)
        if adapter is None:
            return adapters, f"{at}: the harness hashed no {ADAPTER}"
        if adapters and adapter.sha256 == adapters[-1]:
            return adapters, f"{at}: the harness's sha256 of the adapter did not change (the update changed nothing)"
        adapters.append(adapter.sha256)
    moved, why = statehash.adapter_moved(hashes, None, checkpoint_role(engine, 1), ADAPTER)
    return adapters, None if moved else f"{where} update 1: {why}"


def refreshes_of(engine: str, evidence: dict[str, Path], scale: Scale) -> tuple[bool, str]:
    """One engine's refresh chain: (passed, detail naming the engine and the first bad step)."""
    where = f"engine {engine}"
    cycles = scale.policy_refreshes
    summary = read_json(evidence.get(f"refresh_{engine}_summary"))
    why = completed_grpo(summary, cycles)
    if why is not None:
        return False, f"{where}: {why}"
    plan = read_json(evidence.get(plan_role(engine)))
    rollout = rollout_config(plan)
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


def groups_of(engine: str, evidence: dict[str, Path], scale: Scale) -> tuple[bool, str]:
    where = f"engine {engine}"
    cycles = scale.policy_refreshes
    per_group, groups_per_cycle = REFRESH_SIZES["samples_per_prompt"], REFRESH_SIZES["prompts_per_cycle"]
    seen_groups: set[str] = set()
    lines = read_jsonl(evidence.get(f"refresh_{engine}_metrics")) or []
    for cycle in range(1, cycles + 1):
        at = f"{where} cycle {cycle}"
        records = read_jsonl(evidence.get(trajectory_role(engine, cycle)))
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
