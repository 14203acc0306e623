"""The fast rollout engine on CUDA (skipped without CUDA): graphs = eager, streams = CPU, bf16 log-probs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from miniverl.rollout.decoder import SamplingSpec
from miniverl.rollout.engine import EngineRow, FastRolloutEngine
from miniverl.rollout.hf import PromptInput, Trajectory, generate_group
from miniverl.rollout.sampling import sampling_logprobs
from miniverl.rollout.streams import counter_uniforms, uniform_reference
from tests.helpers.tiny import make_tiny_qwen3, make_tiny_tokenizer

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
PROMPTS = [PromptInput("a", "Mia has 7 apples."), PromptInput("b", "Write one short sentence about the sea.")]


def _actor(seed: int = 0) -> tuple[Any, Any]:
    peft = pytest.importorskip("peft")
    tok = make_tiny_tokenizer()
    base = make_tiny_qwen3(tok, seed=seed, initializer_range=0.2)
    actor = peft.get_peft_model(
        base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return actor.to(CUDA), tok


def test_counter_uniforms_on_cuda_equal_the_reference() -> None:
    seeds = torch.tensor([0, 5, 2**62 + 11, 2**63 - 1])
    for n in (0, 3, 4095):
        got = counter_uniforms(seeds.to(CUDA), torch.tensor([n], device=CUDA)).cpu().tolist()
        assert got == [uniform_reference(int(s), n) for s in seeds]


@pytest.mark.parametrize(
    ("dtype", "compile_glue"), [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)]
)
def test_graph_replay_equals_the_eager_step(dtype: torch.dtype, compile_glue: bool) -> None:
    actor, _ = _actor()
    rows = [EngineRow([5, 6, 7, 8, 9][: 2 + i % 4], 100 + i) for i in range(6)]
    spec = SamplingSpec(0.9, 0.95, 40, (2,))
    results = []
    for graphs in (True, False):
        engine = FastRolloutEngine(device=CUDA, dtype=dtype, use_graphs=graphs, compile_glue=graphs and compile_glue)
        engine.sync_policy(actor, 0)
        results.append(engine.generate(rows, batch_size=4, max_new_tokens=70, spec=spec, pad_id=0, check_every=4))
        if graphs:
            assert engine.stats.captures >= 2  # spans 64 and 128
    graphed, eager = results
    for (tg, lg, fg), (te, le, fe) in zip(graphed, eager, strict=True):
        assert tg == te and fg == fe
        assert lg == pytest.approx(le, abs=1e-4 if compile_glue else 1e-5)


def _teacher_forced_logprobs(model: Any, t: Trajectory) -> torch.Tensor:
    ids = torch.tensor([list(t.prompt_token_ids) + list(t.response_token_ids)], device=CUDA)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(t.prompt_token_ids) - 1
    logprobs = sampling_logprobs(logits[start : start + len(t.response_token_ids)], temperature=1.0, top_p=1.0, top_k=0)
    return logprobs.gather(-1, torch.tensor(t.response_token_ids, device=CUDA)[:, None])[:, 0].cpu()


def test_bf16_logprobs_match_the_fp32_training_forward_and_fp32_greedy_matches_hf() -> None:
    actor, tok = _actor(seed=3)
    out = generate_group(actor, tok, PROMPTS, samples_per_prompt=4, max_new_tokens=24, seed=1, engine="fast")
    diffs = torch.cat([torch.tensor(t.sampled_logprobs) - _teacher_forced_logprobs(actor, t) for t in out]).abs()
    print(f"bf16 rollout vs fp32 teacher-forced log-prob |diff|: mean {diffs.mean():.4f} max {diffs.max():.4f}")
    assert float(diffs.mean()) < 0.05 and float(diffs.max()) < 0.5
    kw: dict[str, Any] = {"samples_per_prompt": 1, "max_new_tokens": 24, "temperature": 0.0}
    fast = generate_group(actor, tok, PROMPTS, engine="fast", rollout_dtype=torch.float32, **kw)
    hf = generate_group(actor, tok, PROMPTS, engine="hf", **kw)
    assert [t.response_token_ids for t in fast] == [t.response_token_ids for t in hf]


def test_a_new_policy_version_reuses_the_captured_graphs() -> None:
    actor, tok = _actor(seed=4)
    kw: dict[str, Any] = {"samples_per_prompt": 2, "max_new_tokens": 16, "seed": 2, "engine": "fast", "batch_size": 4}
    generate_group(actor, tok, PROMPTS, policy_version=0, **kw)
    from miniverl.rollout.engine import engine_for

    engine = engine_for(actor, CUDA)
    captures = engine.stats.captures
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_A" in name:
                param.mul_(1.5)
    after = generate_group(actor, tok, PROMPTS, policy_version=1, **kw)
    assert engine.stats.folds == 2 and engine.stats.captures == captures
    # the same kernels as the rollout's engine (triton's on CUDA where it runs): only the graphs differ
    eager = FastRolloutEngine(device=CUDA, dtype=torch.bfloat16, use_graphs=False, kernels=engine.kernels)
    eager.sync_policy(actor, 1)
    rows = [EngineRow(t.prompt_token_ids, t.seed) for t in after]
    expected = eager.generate(rows, batch_size=4, max_new_tokens=16, spec=SamplingSpec(1.0, 1.0, 0, (4,)), pad_id=1)
    assert [list(t.response_token_ids) for t in after] == [e[0] for e in expected]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_switching_the_sampling_spec_recaptures_in_a_fresh_pool(dtype: torch.dtype) -> None:
    """``miniverl eval`` decodes greedy, then sampled, then greedy again with one engine: each switch drops the
    graphs, and capturing into the dropped graphs' pool crashed CUDA's allocator (fp32 eval on the H200)."""
    actor, _ = _actor(seed=3)
    rows = [EngineRow([5, 6, 7, 8, 9][: 2 + i % 4], 100 + i) for i in range(6)]
    greedy, sampled = SamplingSpec(0.0, 1.0, 0, (2,)), SamplingSpec(1.0, 1.0, 0, (2,))
    engine = FastRolloutEngine(device=CUDA, dtype=dtype, use_graphs=True)
    engine.sync_policy(actor, 0)
    runs = [
        engine.generate(rows, batch_size=4, max_new_tokens=70, spec=spec, pad_id=0, check_every=4)
        for spec in (greedy, sampled, greedy, sampled)
    ]
    assert engine.stats.captures >= 8  # spans 64 and 128, captured again at each of the 4 specs
    assert [r[0] for r in runs[0]] == [r[0] for r in runs[2]]
    assert [r[0] for r in runs[1]] == [r[0] for r in runs[3]]


def test_capturing_many_spans_leaves_nothing_allocated_after_release() -> None:
    """Every span's warm-up runs on one side stream, and release_engines frees the cuBLAS workspaces: a
    fresh stream per span kept a 32 MiB workspace each (0.16 GiB after five spans on the H200)."""
    from miniverl.rollout.decoder import warmup_stream
    from miniverl.rollout.engine import release_engines

    actor, _ = _actor()
    release_engines()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    engine = FastRolloutEngine(device=CUDA, dtype=torch.bfloat16)
    engine.sync_policy(actor, 0)
    rows = [EngineRow([5, 6, 7], 100 + i) for i in range(4)]
    engine.generate(rows, batch_size=4, max_new_tokens=300, spec=SamplingSpec(1.0, 1.0, 0, ()), pad_id=0)
    assert engine.stats.captures >= 5  # spans 64 .. 320
    assert warmup_stream(CUDA) is warmup_stream(torch.device("cuda", torch.cuda.current_device()))
    del engine
    release_engines()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 1 << 20


def test_the_engine_a_rollout_gets_runs_the_triton_kernels_on_cuda() -> None:
    pytest.importorskip("triton")
    from miniverl.rollout.engine import default_kernels, engine_for

    actor, tok = _actor()
    assert default_kernels(CUDA, compile_glue=False) == "triton"
    assert default_kernels(CUDA, compile_glue=True) == "torch"
    assert engine_for(actor, CUDA).kernels == "triton"
    trajectories = generate_group(actor, tok, PROMPTS, samples_per_prompt=2, max_new_tokens=12, temperature=0.0)
    assert engine_for(actor, CUDA).stats.decode_steps > 0 and len(trajectories) == 4
