"""The judge of ``vllm_boundary``: a real vLLM run meeting the vLLM evidence contract where ``miniverl plan`` accepted
``rollout.backend: vllm``, the one-line refusal (``not_applicable``) where vllm is absent, a failure otherwise; see
:mod:`harness.qualify.full.refresh` for what it requires."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from harness.qualify.full.base import Judgement
from harness.qualify.full.reading import count, finite, read_json, read_jsonl
from harness.qualify.full.refresh_chain import completed_grpo, rollout_config
from harness.qualify.full.refresh_layout import (
    OLD_LOGP_MAX_ABS_DIFF,
    OLD_LOGP_RECOMPUTED,
    VLLM_ABSENT_REASON,
    VLLM_BACKEND,
    VLLM_DIFF_AGREEMENT,
    VLLM_MIN_LOGP_DIFFERENCE,
    VLLM_REFUSAL_PREFIX,
    trajectory_role,
)

_VERSION = re.compile(r"[0-9]+(\.[0-9]+)+[0-9A-Za-z.+-]*")


def _logprobs(record: dict[str, Any], key: str, tokens: int) -> list[float] | None:
    values = record.get(key)
    if not isinstance(values, list) or len(values) != tokens:
        return None
    out = [finite(v) for v in values]
    return None if any(v is None for v in out) else [v for v in out if v is not None]


def vllm_cycle(cycle: int, line: dict[str, Any], records: list[dict[str, Any]] | None) -> tuple[str | None, str]:
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
    rollout = rollout_config(read_json(evidence.get("refresh_vllm_run_plan")))
    if rollout is None or rollout.get("backend") != VLLM_BACKEND:
        return "the kept plan does not name rollout.backend vllm", ""
    why = completed_grpo(read_json(evidence.get("refresh_vllm_summary")), cycles)
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
        why, version = vllm_cycle(cycle, line, read_jsonl(evidence.get(trajectory_role(VLLM_BACKEND, cycle))))
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


def vllm_accepted(probe: dict[str, Any] | None) -> bool:
    """``miniverl plan`` accepted ``rollout.backend: vllm`` (vllm importable): its run is then judged like the
    engines' and must meet the contract; anything else is the boundary's to judge (refusal or failure)."""
    return probe is not None and count(probe.get("exit_code")) == 0 and probe.get("timed_out") is False


def judge_vllm_boundary(evidence: dict[str, Path], judgement: Judgement, cycles: int) -> None:
    probe = read_json(evidence.get("refresh_vllm_plan"))
    if probe is None:
        judgement.metrics["vllm_backend"] = "failed"
        judgement.check("vllm_boundary", False, "no readable result of `miniverl plan` with rollout.backend=vllm")
        return
    code, line = probe.get("exit_code"), probe.get("stderr_last_line")
    line = line if isinstance(line, str) else ""
    if vllm_accepted(probe):
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
