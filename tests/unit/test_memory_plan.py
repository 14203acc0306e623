"""The memory plan's pure estimator and its choice of checkpointing and micro-batch under a budget."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from miniverl.runtime.memory_plan import (
    GIB,
    DecoderDims,
    MemoryConstants,
    Workload,
    checkpoint_options,
    choose_plan,
    estimate,
    logprob_chunk_options,
)

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SMOLLM2 = DecoderDims(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
TINY = DecoderDims(layers=4, hidden=8, heads=2, kv_heads=1, head_dim=4, intermediate=16, vocab=32)


def _work(**changes: object) -> Workload:
    base = Workload(
        dtype="bfloat16",
        adapter_precision="fp32",
        lora_rank=16,
        lora_targets=TARGETS,
        row_tokens=288,
        update_rows=16,
        logprob_chunk=1024,
        rollout_rows=16,
        rollout_capacity=288,
        fast_engine=True,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_parameter_counts_match_the_smollm2_shape() -> None:
    assert SMOLLM2.base_params() == 134_515_008  # SmolLM2-135M (tied embeddings)
    # r=16 on all 7 targets: sum of (in + out) per layer times r times layers
    per_layer = (576 + 576) + 2 * (576 + 192) + (576 + 576) + 3 * (576 + 1536)  # q, k and v, o, gate up down
    assert SMOLLM2.lora_params(16, TARGETS) == 30 * 16 * per_layer


def test_checkpoint_options_go_from_off_to_every_layer_in_increasing_recomputation() -> None:
    options = checkpoint_options(30)
    assert options[0] == (0, 0) and options[1] == (30, 1) and options[-1] == (1, 30)
    counts = [c for _, c in options]
    assert counts == sorted(set(counts))
    assert all(c == -(-30 // n) for n, c in options[1:])  # HF checkpoints layers whose index % n == 0


def test_the_estimate_is_its_stated_formula_on_a_tiny_shape() -> None:
    constants = MemoryConstants()
    work = _work(row_tokens=10, logprob_chunk=4, rollout_rows=2, rollout_capacity=10, fast_engine=False, lora_rank=2)
    got = estimate(TINY, work, micro_rows=3, checkpointed_layers=2, constants=constants)
    h, i, q, kv = 8, 16, 8, 4
    full = 2 * (6 * h + 3 * i + 2 * (q + 2 * kv)) + 4 * (h + h + h + q + h + h + i)  # + PEFT's fp32 input casts
    tokens = 3 * 10
    kept = tokens * ((4 - 2) * full + 2 * h * 2)
    layer_backward = tokens * (full + full)  # the recomputed layer and its grads
    assert got.activations == pytest.approx(kept) and got.layer_backward == pytest.approx(layer_backward)
    assert got.logits_chunk == pytest.approx(4 * 32 * 4 * 4)
    assert got.rollout_engine == 0 and got.rollout_phase == pytest.approx(2 * 4 * 2 * 10 * kv * 2 + 2 * 32 * 4 * 2)
    assert got.weights == pytest.approx(TINY.base_params() * 2)
    assert got.adapter_optimizer == pytest.approx(TINY.lora_params(2, TARGETS) * 16)
    update = kept + max(got.logits_chunk, layer_backward)  # the logits' and the layers' backward never overlap
    assert got.workspaces == 32 * 2**20  # one stream's cuBLAS workspace (no fast engine: no capture streams)
    peak = 1.15 * (got.weights + got.adapter_optimizer + got.workspaces + max(got.rollout_phase, update))
    assert got.peak == pytest.approx(peak)


def test_less_memory_with_checkpointing_bf16_masters_and_smaller_micro_batches() -> None:
    work = _work()
    plain = estimate(SMOLLM2, work, micro_rows=16, checkpointed_layers=0).peak
    assert estimate(SMOLLM2, work, micro_rows=16, checkpointed_layers=30).peak < plain
    assert estimate(SMOLLM2, work, micro_rows=4, checkpointed_layers=0).peak < plain
    assert estimate(SMOLLM2, _work(adapter_precision="bf16_master"), micro_rows=16, checkpointed_layers=0).peak < plain
    with pytest.raises(ValueError):
        estimate(SMOLLM2, work, micro_rows=0, checkpointed_layers=0)


def test_the_estimates_are_near_the_h200_measurements() -> None:
    """Peak reserved measured on the H200 on 2026-12-03 (docs/measurements/2026-12-03-h200-perf): bench grpo's
    SmolLM2 16 x 256 step, fast path (PEFT's fp32 adapter, one forward) 6.89 GiB and lean path (bf16 masters,
    micro-batch 8, every layer checkpointed, chunk 128) 1.23 GiB; Qwen3-0.6B updates of 8 x 512 with bf16
    masters, no checkpointing 10.06 GiB and every 4th layer 8.50 GiB."""
    fast = estimate(SMOLLM2, _work(), micro_rows=16, checkpointed_layers=0).peak / GIB
    lean = (
        estimate(
            SMOLLM2, _work(adapter_precision="bf16_master"), micro_rows=8, checkpointed_layers=30, logprob_chunk=128
        ).peak
        / GIB
    )
    qwen3 = DecoderDims(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=151936)
    update = _work(
        adapter_precision="bf16_master", row_tokens=512, update_rows=8, rollout_rows=1, rollout_capacity=1,
        fast_engine=False,
    )  # fmt: skip
    plain = estimate(qwen3, update, micro_rows=8, checkpointed_layers=0).peak / GIB
    every_4th = estimate(qwen3, update, micro_rows=8, checkpointed_layers=7).peak / GIB
    assert fast == pytest.approx(6.89, rel=0.15) and lean == pytest.approx(1.23, rel=0.15)
    # 2026-12-04 (docs/measurements/2026-12-04-h200-release): the lean path with the engine released after each
    # rollout, micro-batch 16, every layer checkpointed, chunk 256: 0.91 GiB
    released = estimate(
        SMOLLM2, _work(adapter_precision="bf16_master"), micro_rows=16, checkpointed_layers=30, logprob_chunk=256,
        release_rollout=True,
    )  # fmt: skip
    assert released.peak / GIB == pytest.approx(0.91, rel=0.15)
    assert plain == pytest.approx(10.06, rel=0.15) and every_4th == pytest.approx(8.50, rel=0.15)


def test_a_large_budget_keeps_everything_and_the_whole_step_in_one_micro_batch() -> None:
    plan = choose_plan(SMOLLM2, _work(), 40.0, activation_checkpointing="auto", trajectory_batch_size="auto")
    assert plan.fits and plan.activation_checkpointing == 0 and plan.micro_rows == 16
    assert plan.max_tokens == 16 * 288
    assert plan.metrics()["memory_plan/fits"] == 1.0 and "no activation checkpointing" in plan.describe()


@pytest.mark.parametrize(("fast_engine", "budget"), [(True, 0.9), (False, 0.8)], ids=["fast-engine", "hf-engine"])
def test_a_tight_budget_chooses_checkpointing_and_a_smaller_micro_batch_that_fit(
    fast_engine: bool, budget: float
) -> None:
    work = _work(fast_engine=fast_engine)
    plan = choose_plan(SMOLLM2, work, budget, activation_checkpointing="auto", trajectory_batch_size="auto")
    assert plan.fits and plan.estimate.peak <= budget * GIB
    assert plan.activation_checkpointing >= 1 and 1 < plan.micro_rows < 16
    assert plan.release_rollout == fast_engine  # the HF engine keeps nothing between rollouts to release
    # the largest micro-batch: one more row would not fit under any checkpointing, with the smallest chunk
    bigger = estimate(
        SMOLLM2, work, micro_rows=plan.micro_rows + 1, checkpointed_layers=30, logprob_chunk=128,
        release_rollout=plan.release_rollout,
    )  # fmt: skip
    assert bigger.peak > budget * GIB
    assert "chose activation_checkpointing, micro-batch" in plan.describe()


def test_releasing_the_rollout_engine_moves_it_from_resident_to_the_rollout_phase() -> None:
    work = _work(adapter_precision="bf16_master")
    kept = estimate(SMOLLM2, work, micro_rows=16, checkpointed_layers=30, logprob_chunk=256)
    released = estimate(SMOLLM2, work, micro_rows=16, checkpointed_layers=30, logprob_chunk=256, release_rollout=True)
    assert released.rollout_engine == kept.rollout_engine > 0
    assert released.resident == pytest.approx(kept.resident - kept.rollout_engine)
    update = released.activations + max(released.logits_chunk, released.layer_backward)
    rollout = released.rollout_phase + released.rollout_engine  # the engine lives while it samples
    assert released.peak == pytest.approx(1.15 * (released.resident + max(rollout, update)))
    assert released.peak < kept.peak
    with pytest.raises(ValueError, match="fast engine"):
        estimate(SMOLLM2, _work(fast_engine=False), micro_rows=1, checkpointed_layers=0, release_rollout=True)


def test_the_rollout_engine_is_released_only_when_that_fits_more_rows() -> None:
    """SmolLM2 16 x 256 with bf16 masters: under TRL's 1.05 GiB the resident engine leaves room for
    micro-batches of 5 rows, released it leaves room for all 16 (the H200 lean path)."""
    work = _work(adapter_precision="bf16_master")
    roomy = choose_plan(SMOLLM2, work, 1.5, activation_checkpointing="auto", trajectory_batch_size="auto")
    assert roomy.micro_rows == 16 and not roomy.release_rollout and "rollout release" not in roomy.chosen
    assert "resident" in roomy.describe() and roomy.metrics()["memory_plan/release_rollout"] == 0.0
    tight = choose_plan(SMOLLM2, work, 1.05, activation_checkpointing="auto", trajectory_batch_size="auto")
    assert tight.fits and tight.release_rollout and tight.micro_rows == 16 and "rollout release" in tight.chosen
    assert "released after each rollout" in tight.describe()
    assert tight.metrics()["memory_plan/release_rollout"] == 1.0
    # resident, the most frugal settings (every layer checkpointed, the smallest chunk) fit 5 rows at most
    resident_rows = [
        rows
        for rows in range(1, 17)
        if estimate(SMOLLM2, work, micro_rows=rows, checkpointed_layers=30, logprob_chunk=128).peak <= 1.05 * GIB
    ]
    assert max(resident_rows) == 5


def test_more_budget_never_means_more_recomputation_or_a_smaller_micro_batch() -> None:
    last = None
    for budget in (1.2, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0):
        plan = choose_plan(SMOLLM2, _work(), budget, activation_checkpointing="auto", trajectory_batch_size="auto")
        assert plan.fits
        if last is not None:
            assert plan.micro_rows >= last.micro_rows
            if plan.micro_rows == last.micro_rows:
                assert plan.checkpointed_layers <= last.checkpointed_layers
        last = plan


def test_given_settings_stay_and_only_auto_is_chosen() -> None:
    plan = choose_plan(SMOLLM2, _work(), 3.0, activation_checkpointing=2, trajectory_batch_size="auto")
    assert plan.activation_checkpointing == 2 and plan.checkpointed_layers == 15
    plan = choose_plan(SMOLLM2, _work(), 3.0, activation_checkpointing="auto", trajectory_batch_size=4)
    assert plan.micro_rows == 4 and plan.chosen[0] == "activation_checkpointing"
    assert plan.checkpointed_layers == min(
        c
        for _, c in checkpoint_options(30)
        if any(
            estimate(SMOLLM2, _work(), micro_rows=4, checkpointed_layers=c, logprob_chunk=k).peak <= 3 * GIB
            for k in logprob_chunk_options(1024)
        )
    )


def test_the_plan_halves_the_logprob_chunk_before_it_recomputes_more_layers() -> None:
    """A chunk of 1024 rows of fp32 logits over SmolLM2's 49,152-token vocabulary is 0.56 GiB with its copies:
    at a budget near TRL's peak the plan keeps the whole step in one micro-batch with a smaller chunk."""
    assert logprob_chunk_options(1024) == [1024, 512, 256, 128] and logprob_chunk_options(100) == [100]
    plan = choose_plan(SMOLLM2, _work(), 1.33, activation_checkpointing="auto", trajectory_batch_size="auto")
    assert plan.fits and plan.logprob_chunk < 1024 and "log-prob chunk" in plan.chosen
    assert plan.metrics()["memory_plan/logprob_chunk"] == plan.logprob_chunk
    assert f"log-prob chunk {plan.logprob_chunk} rows" in plan.describe()
    with_chunk = estimate(SMOLLM2, _work(), micro_rows=plan.micro_rows, checkpointed_layers=plan.checkpointed_layers)
    assert with_chunk.logits_chunk > plan.estimate.logits_chunk
    # a larger chunk at the same checkpointing would not have fitted the same micro-batch
    larger = estimate(
        SMOLLM2, _work(), micro_rows=plan.micro_rows, checkpointed_layers=plan.checkpointed_layers,
        logprob_chunk=plan.logprob_chunk * 2, release_rollout=plan.release_rollout,
    )  # fmt: skip
    assert larger.peak > 1.33 * GIB
    # a chunk already small is never changed
    given = choose_plan(
        SMOLLM2, _work(logprob_chunk=128), 40.0, activation_checkpointing="auto", trajectory_batch_size="auto"
    )
    assert given.logprob_chunk == 128 and "log-prob chunk" not in given.chosen


def test_a_budget_nothing_fits_is_said_not_to_fit() -> None:
    plan = choose_plan(SMOLLM2, _work(), 0.5, activation_checkpointing="auto", trajectory_batch_size="auto")
    assert not plan.fits and plan.micro_rows == 1 and plan.checkpointed_layers == 30
    assert "DOES NOT FIT" in plan.describe() and plan.metrics()["memory_plan/fits"] == 0.0


def _vllm_work(rows: int = 32, capacity: int = 512) -> Any:
    from miniverl.runtime.memory_plan import Workload

    return Workload(
        dtype="bfloat16",
        adapter_precision="fp32",
        lora_rank=16,
        lora_targets=("q_proj", "v_proj"),
        row_tokens=capacity,
        update_rows=rows,
        logprob_chunk=1024,
        rollout_rows=rows,
        rollout_capacity=capacity,
        fast_engine=False,
        vllm_engine=True,
    )


def test_vllms_share_is_what_it_needs_rounded_up_to_a_hundredth() -> None:
    from miniverl.runtime.memory_plan import GIB, VLLM_RUNTIME_BYTES, kv_cache_bytes, vllm_memory

    dims = SMOLLM2
    memory = vllm_memory(dims, _vllm_work(), device_bytes=80 * GIB)
    weights = dims.base_params() * 2.0
    kv = 2.0 * kv_cache_bytes(dims, 32, 512, 2.0)
    assert memory.need_bytes > weights + kv + VLLM_RUNTIME_BYTES  # plus the adapter slot
    assert memory.share * 80 * GIB >= memory.need_bytes > (memory.share - 0.01) * 80 * GIB
    assert (memory.max_model_len, memory.max_num_seqs) == (512, 32)
    assert memory.kv_cache_bytes == math.ceil(kv) and memory.kv_cache_bytes < memory.need_bytes
    assert memory.metrics()["rollout/vllm_memory_share"] == memory.share
    # a longer rollout needs a larger share; a smaller card gives it a larger fraction
    assert vllm_memory(dims, _vllm_work(capacity=4096), device_bytes=80 * GIB).share > memory.share
    assert vllm_memory(dims, _vllm_work(), device_bytes=16 * GIB).share > memory.share


def test_vllm_beyond_the_ceiling_is_refused() -> None:
    from miniverl.runtime.memory_plan import GIB, vllm_memory

    with pytest.raises(ValueError, match=r"vLLM needs .* GiB for this rollout, more than 90% of the device"):
        vllm_memory(SMOLLM2, _vllm_work(rows=4096, capacity=8192), device_bytes=16 * GIB)


def test_the_plan_counts_vllm_awake_in_the_rollout_and_asleep_in_the_update() -> None:
    from miniverl.runtime.memory_plan import estimate, vllm_need_bytes

    work = _vllm_work()
    plan = estimate(SMOLLM2, work, micro_rows=4, checkpointed_layers=0)
    need = vllm_need_bytes(SMOLLM2, rollout_rows=32, capacity=512, lora_rank=16, targets=("q_proj", "v_proj"))
    assert plan.rollout_engine == 0.0 and plan.rollout_phase == need
    hf = estimate(SMOLLM2, dataclasses.replace(work, vllm_engine=False), micro_rows=4, checkpointed_layers=0)
    assert plan.peak > hf.peak and plan.resident == hf.resident


def test_the_fused_kernels_constants_fit_their_committed_measurement() -> None:
    """The Qwen3-0.6B-shape update (8 x 512, bf16 masters) measured on the H100 with and without the fused kernels
    (docs/measurements/2026-12-06-h100-perf-fused/grpo.json): the plan's estimate within 5 % of each peak."""
    import json
    from pathlib import Path

    from miniverl.gate.models import LORA_TARGETS
    from miniverl.runtime.memory_plan import GIB, Workload, estimate

    measured = json.loads(
        (Path(__file__).parents[2] / "docs/measurements/2026-12-06-h100-perf-fused/grpo.json").read_text()
    )
    peaks = {c["path"]: c["peak_reserved_gib"] for c in measured["cells"]}
    qwen3 = DecoderDims(layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, vocab=151936)
    work = Workload(
        dtype="bfloat16", adapter_precision="bf16_master", lora_rank=16, lora_targets=tuple(LORA_TARGETS),
        row_tokens=512, update_rows=8, logprob_chunk=1024, rollout_rows=1, rollout_capacity=1, fast_engine=False,
    )  # fmt: skip
    for path, fused in (("miniverl_update_bf16", False), ("miniverl_update_bf16_fused", True)):
        peak = estimate(qwen3, dataclasses.replace(work, fused_kernels=fused), micro_rows=8, checkpointed_layers=0)
        assert abs(peak.peak / GIB - peaks[path]) <= 0.05 * peaks[path], (path, peak.peak / GIB, peaks[path])
