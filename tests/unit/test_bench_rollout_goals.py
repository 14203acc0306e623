"""Issue 21's decode targets are judged only on their own workload (Qwen3-0.6B shape, LoRA folded, CUDA)."""

from __future__ import annotations

from typing import Any

from miniverl.bench.rollout_render import evaluate_rollout_goals


def _report(*, model: str = "qwen3-0.6b-shape", lora_rank: int = 16, device: str = "cuda", ms: float = 1.2,
            pct: float = 45.0) -> dict[str, Any]:  # fmt: skip
    cells = [
        {"path": "fast", "batch": b, "status": "measured", "ms_per_decode_step": ms, "pct_of_bandwidth_bound": pct}
        for b in (16, 64)
    ]
    return {"options": {"model": model, "lora_rank": lora_rank}, "device": device, "cells": cells}


def _statuses(report: dict[str, Any]) -> list[str]:
    return [g["status"] for g in evaluate_rollout_goals(report)]


def test_the_targets_are_met_and_missed_by_their_figures() -> None:
    assert _statuses(_report(ms=0.9, pct=45.0)) == ["met", "met", "met"]
    assert _statuses(_report(ms=1.2, pct=45.0)) == ["met", "met", "not_met"]  # b64 <= 1.4, b16 > 1.0
    assert _statuses(_report(ms=1.5, pct=39.0)) == ["not_met", "not_met", "not_met"]


def test_another_workload_or_a_cpu_run_cannot_meet_them() -> None:
    assert _statuses(_report(model="tiny")) == ["not_measured"] * 3
    assert _statuses(_report(lora_rank=0)) == ["not_measured"] * 3
    assert _statuses(_report(device="cpu")) == ["informational_cpu"] * 3


def test_the_triton_engine_is_judged_by_its_own_name_when_timed() -> None:
    report = _report(ms=1.5, pct=39.0)
    report["cells"] += [
        {
            "path": "fast_triton",
            "batch": b,
            "status": "measured",
            "ms_per_decode_step": 0.9,
            "pct_of_bandwidth_bound": 5e1,
        }
        for b in (64, 16)
    ]
    goals = evaluate_rollout_goals(report)
    assert [(g["name"].split()[0], g["status"]) for g in goals] == [
        ("fast", "not_met"), ("fast", "not_met"), ("fast", "not_met"),
        ("fast_triton", "met"), ("fast_triton", "met"), ("fast_triton", "met"),
    ]  # fmt: skip
    report["cells"][-1]["status"] = "not_run"  # the untimed triton batch 16 is no goal; batch 64 still is
    assert [g["name"] for g in evaluate_rollout_goals(report)][3:] == [
        "fast_triton ms per decode step at batch 64",
        "fast_triton % of the weights+KV bandwidth bound at batch 64",
    ]
