"""The fast rollout engine on CPU: equal to the HF path, exact log-probs, batch-independent streams."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from miniverl.errors import UsageError
from miniverl.rollout.engine import engine_for
from miniverl.rollout.hf import PromptInput, Trajectory, generate_group
from miniverl.rollout.sampling import inverse_cdf_draw, sampling_logprobs
from miniverl.rollout.streams import counter_uniforms, uniform_reference
from tests.helpers.tiny import make_tiny_llama, make_tiny_qwen3, make_tiny_tokenizer

PROMPTS = [
    PromptInput("a", "Mia has 7 apples."),
    PromptInput("b", "Sam has 3 boxes of 4 pencils and 2 loose pencils. How many pencils does Sam have?"),
    PromptInput("c", "Write one short sentence about the sea."),
]


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok() -> Any:
    return make_tiny_tokenizer()


def _lora_actor(base: Any, seed: int = 5) -> Any:
    """A PEFT LoRA actor with B != 0 on every projection, so the fold really changes the weights."""
    peft = pytest.importorskip("peft")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    actor = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)
    return actor


def _gen(model: Any, tok: Any, **kw: Any) -> list[Trajectory]:
    args: dict[str, Any] = {"samples_per_prompt": 2, "max_new_tokens": 12, "seed": 3, "batch_size": 8}
    args.update(kw)
    return generate_group(model, tok, PROMPTS, **args)


def _teacher_forced_logits(model: Any, t: Trajectory) -> torch.Tensor:
    ids = torch.tensor([list(t.prompt_token_ids) + list(t.response_token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    start = len(t.prompt_token_ids) - 1
    return logits[start : start + len(t.response_token_ids)]


def test_counter_uniforms_are_splitmix64() -> None:
    seeds = torch.tensor([0, 1, 12345, 2**62 + 7, 2**63 - 1])
    for n in (0, 1, 2, 255, 10**6):
        got = counter_uniforms(seeds, torch.tensor([n])).tolist()
        assert got == [uniform_reference(int(s), n) for s in seeds]
    many = counter_uniforms(torch.arange(4096), torch.tensor([0]))
    assert float(many.min()) >= 0.0 and float(many.max()) < 1.0
    assert abs(float(many.mean()) - 0.5) < 0.02


@pytest.mark.parametrize("factory", [make_tiny_llama, make_tiny_qwen3], ids=["llama", "qwen3"])
def test_greedy_tokens_equal_the_hf_path_fp32(tok: Any, factory: Any) -> None:
    actor = _lora_actor(factory(tok, seed=1, initializer_range=0.2))
    hf = _gen(actor, tok, engine="hf", temperature=0.0, max_new_tokens=16)
    fast = _gen(actor, tok, engine="fast", temperature=0.0, max_new_tokens=16, batch_size=4)
    assert [t.response_token_ids for t in fast] == [t.response_token_ids for t in hf]
    assert [t.finish_reason for t in fast] == [t.finish_reason for t in hf]
    assert len({t.response_token_ids for t in fast}) > 1  # the prompts lead to different answers


@pytest.mark.parametrize("settings", [{"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9, "top_k": 20}])
def test_reported_logprobs_equal_a_teacher_forced_forward(tok: Any, settings: dict[str, Any]) -> None:
    actor = _lora_actor(make_tiny_qwen3(tok, seed=2, initializer_range=0.2))
    out = _gen(actor, tok, engine="fast", max_new_tokens=16, **settings)
    reference = copy.deepcopy(actor).double()
    for t in out:
        full = {"top_p": 1.0, "top_k": 0, **settings}
        logprobs = sampling_logprobs(_teacher_forced_logits(reference, t), **full)
        picked = logprobs.gather(-1, torch.tensor(t.response_token_ids)[:, None])[:, 0]
        assert picked.isfinite().all()
        assert torch.allclose(torch.tensor(t.sampled_logprobs), picked, atol=1e-4)


def test_draws_are_the_counter_stream_and_independent_of_batch_composition(tok: Any) -> None:
    model = make_tiny_llama(tok, seed=0)
    reference = {(t.prompt_id, t.sample_index): t for t in _gen(model, tok, engine="fast", samples_per_prompt=3)}
    variants = [
        _gen(model, tok, engine="fast", samples_per_prompt=3, batch_size=1),
        _gen(model, tok, engine="fast", samples_per_prompt=3, batch_size=4),
        generate_group(model, tok, PROMPTS[::-1], samples_per_prompt=3, max_new_tokens=12, seed=3, batch_size=5),
        generate_group(model, tok, PROMPTS[1:2], samples_per_prompt=3, max_new_tokens=12, seed=3, batch_size=2),
    ]
    for variant in variants:
        for t in variant:
            ref = reference[(t.prompt_id, t.sample_index)]
            assert t.response_token_ids == ref.response_token_ids
            assert t.sampled_logprobs == pytest.approx(ref.sampled_logprobs, abs=1e-6)
    # token 0 of each sample is the inverse-CDF draw of uniform(seed, 0) from the prompt's distribution
    for t in reference.values():
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([list(t.prompt_token_ids)])).logits[0, -1:]
        u = torch.tensor([uniform_reference(t.seed, 0)], dtype=torch.float64)
        assert (
            int(inverse_cdf_draw(sampling_logprobs(logits, temperature=1.0, top_p=1.0, top_k=0), u))
            == (t.response_token_ids[0])
        )


def test_refolds_once_per_policy_version(tok: Any) -> None:
    actor = _lora_actor(make_tiny_llama(tok, seed=3, initializer_range=0.2))
    engine = engine_for(actor, torch.device("cpu"))
    before = _gen(actor, tok, engine="fast", temperature=0.0, policy_version=0)
    folds = engine.stats.folds
    _gen(actor, tok, engine="fast", temperature=0.0, policy_version=0)
    assert engine.stats.folds == folds  # same version, same parameters: no refold
    optimizer = torch.optim.SGD([p for p in actor.parameters() if p.requires_grad], lr=0.5)
    actor.train()
    loss = actor(input_ids=torch.tensor([list(before[0].prompt_token_ids)])).logits.pow(2).mean()
    loss.backward()
    optimizer.step()
    after = _gen(actor, tok, engine="fast", temperature=0.0, policy_version=1)
    assert engine.stats.folds == folds + 1
    hf_after = _gen(actor, tok, engine="hf", temperature=0.0, policy_version=1)
    assert [t.response_token_ids for t in after] == [t.response_token_ids for t in hf_after]
    assert [t.response_token_ids for t in after] != [t.response_token_ids for t in before]


def test_early_stop_checks_every_k_steps(tok: Any) -> None:
    model = make_tiny_llama(tok, seed=0)
    free = _gen(model, tok, engine="fast", max_new_tokens=16)
    stop = free[0].response_token_ids[1]
    for k in (1, 3, 32):
        stopped = _gen(model, tok, engine="fast", max_new_tokens=16, eos_token_ids=[stop], check_every=k)
        for f, s in zip(free, stopped, strict=True):
            cut = next((i + 1 for i, x in enumerate(f.response_token_ids) if x == stop), None)
            assert s.response_token_ids == f.response_token_ids[:cut]
            assert s.finish_reason == ("eos" if cut else "length")


def test_engine_choice(tok: Any) -> None:
    model = make_tiny_llama(tok, seed=0)
    with pytest.raises(UsageError, match="engine"):
        _gen(model, tok, engine="vllm")
    with pytest.raises(UsageError, match="check_every"):
        _gen(model, tok, check_every=0)
    model.config.hidden_act = "gelu"  # unsupported by the fast engine: auto falls back, fast refuses
    assert len(_gen(model, tok, engine="auto", max_new_tokens=2)) == 6
    with pytest.raises(UsageError, match="hidden_act"):
        _gen(model, tok, engine="fast", max_new_tokens=2)


def test_switching_the_active_adapter_refolds(tok: Any) -> None:
    actor = _lora_actor(make_tiny_llama(tok, seed=4, initializer_range=0.2), seed=6)
    peft = pytest.importorskip("peft")
    actor.add_adapter("other", peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B.other" in name:
                param.normal_(0.0, 0.3)
    first = _gen(actor, tok, engine="fast", temperature=0.0)
    actor.set_adapter("other")  # same policy version, no parameter written: only the adapter state changed
    switched = _gen(actor, tok, engine="fast", temperature=0.0)
    expected = _gen(actor, tok, engine="hf", temperature=0.0)
    assert [t.response_token_ids for t in switched] == [t.response_token_ids for t in expected]
    assert [t.response_token_ids for t in switched] != [t.response_token_ids for t in first]


def test_adapter_toggle_refolds_and_never_writes_into_the_model(tok: Any) -> None:
    """A fold taken with the adapter disabled, then one with it enabled, then disabled again (what
    ``miniverl eval`` does, base then trained, at one policy version): each decodes what a fresh
    engine decodes, and the model's own tensors are never written (the rollout copy owns its tensors).
    """
    from miniverl.rollout.engine import release_engines

    actor = _lora_actor(make_tiny_llama(tok, seed=4, initializer_range=0.2))
    saved = {name: p.detach().clone() for name, p in actor.named_parameters()}

    def run(off: bool, fresh: bool) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
        if fresh:
            release_engines()
        if off:
            with actor.disable_adapter():
                out = _gen(actor, tok, engine="fast")
        else:
            out = _gen(actor, tok, engine="fast")
        return [(t.response_token_ids, t.sampled_logprobs) for t in out]

    release_engines()
    shared = [run(off, fresh=False) for off in (True, False, True, False)]
    for name, p in actor.named_parameters():
        assert torch.equal(p, saved[name]), f"the rollout fold wrote into the model's {name}"
    assert shared[0] == run(True, fresh=True)
    assert shared[1] == run(False, fresh=True)
    assert shared[2] == shared[0] and shared[3] == shared[1]
    assert shared[0] != shared[1]  # the adapter really changes the samples
    engine = engine_for(actor, torch.device("cpu"))
    assert engine.stats.folds == 1  # the fresh engine above


def test_a_cpu_rollout_runs_torchs_kernels_whatever_triton_can_do() -> None:
    """The triton kernels are the default on CUDA only (on CPU they run under the interpreter, a test tool)."""
    from miniverl.rollout.engine import default_kernels

    assert default_kernels(torch.device("cpu"), compile_glue=False) == "torch"
    assert default_kernels(torch.device("cpu"), compile_glue=True) == "torch"


def test_a_frozen_embedding_in_the_rollout_dtype_is_read_in_place_never_copied_nor_written(tok: Any) -> None:
    """The fold shares a frozen, tied embedding that is already in the rollout dtype (0.29 GiB of Qwen3-0.6B's
    bf16 copy); a refold after a step never writes into it; in another dtype it is a copy as before."""
    from miniverl.rollout.weights import fold_policy

    actor = _lora_actor(make_tiny_qwen3(tok, seed=2))
    own = actor.get_base_model().model.embed_tokens.weight
    before = own.detach().clone()
    folded = fold_policy(actor, device=torch.device("cpu"), dtype=own.dtype)
    assert folded.tied and folded.embed.data_ptr() == own.data_ptr() and folded.lm_head is folded.embed
    qkv_before = folded.layers[0].qkv.clone()
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B" in name:
                param.add_(0.5)
    again = fold_policy(actor, device=torch.device("cpu"), dtype=own.dtype, into=folded)
    assert again.embed.data_ptr() == own.data_ptr() and torch.equal(own, before)
    assert not torch.equal(again.layers[0].qkv, qkv_before)  # the adapters' step did reach the folded layers
    other = fold_policy(actor, device=torch.device("cpu"), dtype=torch.bfloat16)
    assert other.embed.data_ptr() != own.data_ptr() and torch.equal(other.embed, before.to(torch.bfloat16))
