"""The HF rollout backend on tiny random models: determinism, batch invariance, stops, log-probs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

from miniverl.errors import UsageError
from miniverl.rollout.hf import (
    PromptInput,
    Trajectory,
    encode_prompt,
    generate_group,
    resolve_eos_ids,
    resolve_pad_id,
)
from miniverl.rollout.records import TrajectoryRecord
from miniverl.rollout.sampling import derive_sample_seed, sampling_logprobs
from tests.helpers.tiny import make_tiny_llama, make_tiny_qwen3, make_tiny_tokenizer

SHORT = PromptInput("a", "Mia has 7 apples.")
LONG = PromptInput("b", "Sam has 3 boxes of 4 pencils and 2 loose pencils. How many pencils does Sam have?")
THIRD = PromptInput("c", "Write one short sentence about the sea.")


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Any:
    # Tiny models gain nothing from intra-op threads, and on a busy 2-core machine thread spinning
    # makes each forward ~30x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok() -> Any:
    return make_tiny_tokenizer()


@pytest.fixture(scope="module")
def llama(tok: Any) -> Any:
    return make_tiny_llama(tok, seed=0)


def _gen(model: Any, tok: Any, prompts: list[PromptInput], **kw: Any) -> list[Trajectory]:
    args: dict[str, Any] = {"samples_per_prompt": 2, "max_new_tokens": 12, "seed": 3, "batch_size": 8}
    args.update(kw)
    return generate_group(model, tok, prompts, **args)


def _by_key(trajectories: list[Trajectory]) -> dict[tuple[str, int], Trajectory]:
    return {(t.prompt_id, t.sample_index): t for t in trajectories}


def _full_logits(model: Any, t: Trajectory) -> torch.Tensor:
    """Logits predicting each response token, from one unpadded forward over prompt + response."""
    ids = torch.tensor([list(t.prompt_token_ids) + list(t.response_token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    start = len(t.prompt_token_ids) - 1
    return logits[start : start + len(t.response_token_ids)]


def test_output_shape_order_and_provenance(llama: Any, tok: Any) -> None:
    out = _gen(llama, tok, [SHORT, LONG], policy_version=4)
    assert [(t.prompt_id, t.sample_index) for t in out] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    for t in out:
        assert t.policy_version == 4 and t.group_id == f"{t.prompt_id}@v4"
        assert t.seed == derive_sample_seed(3, 4, t.prompt_id, t.sample_index)
        assert len(t.sampled_logprobs) == len(t.response_token_ids) == 12
        assert t.finish_reason == "length" and t.response_token_count == 12
        assert all(lp <= 0.0 for lp in t.sampled_logprobs)
        assert t.response_text == tok.decode(list(t.response_token_ids), skip_special_tokens=True)
    assert out[0].prompt_text == SHORT.prompt
    assert out[0].response_token_ids != out[1].response_token_ids  # samples of one prompt differ


def test_deterministic_and_independent_of_batching(llama: Any, tok: Any) -> None:
    prompts = [SHORT, LONG, THIRD]
    reference = _by_key(_gen(llama, tok, prompts, samples_per_prompt=3))
    assert _by_key(_gen(llama, tok, prompts, samples_per_prompt=3)) == reference
    for variant in (
        _gen(llama, tok, prompts, samples_per_prompt=3, batch_size=1),
        _gen(llama, tok, prompts, samples_per_prompt=3, batch_size=4),
        _gen(llama, tok, [THIRD, SHORT, LONG], samples_per_prompt=3, batch_size=5),
        _gen(llama, tok, [LONG], samples_per_prompt=3, batch_size=2),
    ):
        for key, t in _by_key(variant).items():
            assert t.response_token_ids == reference[key].response_token_ids, key
            assert t.sampled_logprobs == pytest.approx(reference[key].sampled_logprobs, abs=1e-5)
    # the seed and the policy version both change the draws
    other_seed = _by_key(_gen(llama, tok, prompts, samples_per_prompt=3, seed=4))
    other_version = _by_key(_gen(llama, tok, prompts, samples_per_prompt=3, policy_version=1))
    for other in (other_seed, other_version):
        assert all(other[k].response_token_ids != reference[k].response_token_ids for k in reference)


def test_model_honours_position_ids_and_mask_under_left_padding(tok: Any) -> None:
    # A sharper random model (init 0.2) so that positions and masking visibly move the logits.
    model = make_tiny_llama(tok, seed=0, initializer_range=0.2)
    ids = encode_prompt(tok, SHORT.prompt)
    pad = 7
    padded = torch.tensor([[tok.pad_token_id] * pad + ids])
    mask = torch.tensor([[0] * pad + [1] * len(ids)])
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        alone = model(input_ids=torch.tensor([ids])).logits[0, -1]
        padded_row = model(input_ids=padded, attention_mask=mask, position_ids=positions).logits[0, -1]
        stretched = model(input_ids=padded, attention_mask=mask, position_ids=positions * 3).logits[0, -1]
        unmasked = model(input_ids=padded).logits[0, -1]
    assert torch.allclose(alone, padded_row, atol=1e-5)
    # the model reads the position ids we pass (RoPE is shift-invariant, so test a stretch) and the mask
    assert (alone - stretched).abs().max() > 0.1
    assert (alone - unmasked).abs().max() > 0.1


@pytest.mark.parametrize("factory", [make_tiny_llama, make_tiny_qwen3], ids=["llama", "qwen3"])
@pytest.mark.parametrize("with_pad", [True, False], ids=["pad", "no-pad"])
def test_left_padding_batch_invariance(factory: Callable[..., Any], with_pad: bool) -> None:
    tok = make_tiny_tokenizer(with_pad_token=with_pad)
    model = factory(tok, seed=1)
    assert resolve_pad_id(tok, resolve_eos_ids(model, tok)) == (1 if with_pad else tok.eos_token_id)
    kw = {"samples_per_prompt": 2, "max_new_tokens": 16, "temperature": 0.8, "top_k": 50, "top_p": 0.95}
    alone = _gen(model, tok, [SHORT], **kw)
    batched = _gen(model, tok, [SHORT, LONG], **kw)
    assert len(LONG.prompt) > 2 * len(SHORT.prompt)
    for a, b in zip(alone, batched[:2], strict=True):
        assert a.response_token_ids == b.response_token_ids
        assert a.sampled_logprobs == pytest.approx(b.sampled_logprobs, abs=1e-5)


def test_greedy_is_argmax_of_a_full_forward(llama: Any, tok: Any) -> None:
    out = _gen(llama, tok, [SHORT, LONG], temperature=0.0, samples_per_prompt=2)
    assert out[0].response_token_ids == out[1].response_token_ids  # greedy ignores the seed
    for t in out:
        assert list(t.response_token_ids) == _full_logits(llama, t).argmax(-1).tolist()
        assert t.sampled_logprobs == (0.0,) * len(t.response_token_ids)


def test_sampled_logprobs_match_a_float64_full_forward(llama: Any, tok: Any) -> None:
    reference = copy.deepcopy(llama).double()
    out = _gen(llama, tok, [SHORT, LONG], temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16)
    for t in out:
        logits = _full_logits(reference, t)
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(t.response_token_ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(t.sampled_logprobs, dtype=torch.float64), expected, atol=1e-5)


def test_filtered_logprobs_match_the_filtered_distribution(llama: Any, tok: Any) -> None:
    settings = {"temperature": 0.7, "top_p": 0.9, "top_k": 20}
    out = _gen(llama, tok, [SHORT, LONG], max_new_tokens=16, **settings)
    for t in out:
        logprobs = sampling_logprobs(_full_logits(llama, t), **settings)
        assert logprobs.isfinite().sum(-1).max() <= 20
        picked = logprobs.gather(-1, torch.tensor(t.response_token_ids)[:, None])[:, 0]
        assert picked.isfinite().all()  # every sampled token survived top-k/top-p
        assert torch.allclose(torch.tensor(t.sampled_logprobs), picked, atol=1e-4)
        # the filtered distribution is sharper than the plain one
        plain = torch.log_softmax(_full_logits(llama, t), -1)
        plain_picked = plain.gather(-1, torch.tensor(t.response_token_ids)[:, None])[:, 0]
        assert (picked > plain_picked).all()


def _cut_at_first(tokens: tuple[int, ...], stop: set[int]) -> tuple[int, ...]:
    for i, token in enumerate(tokens):
        if token in stop:
            return tokens[: i + 1]
    return tokens


def test_eos_stops_a_row_and_leaves_the_others_alone(llama: Any, tok: Any) -> None:
    prompts = [SHORT, LONG, THIRD]
    free = _gen(llama, tok, prompts, samples_per_prompt=2, max_new_tokens=16)
    stop_token = free[0].response_token_ids[2]
    stopped = _gen(llama, tok, prompts, samples_per_prompt=2, max_new_tokens=16, eos_token_ids=[stop_token])
    assert stopped[0].finish_reason == "eos" and len(stopped[0].response_token_ids) <= 3
    for f, s in zip(free, stopped, strict=True):
        assert s.response_token_ids == _cut_at_first(f.response_token_ids, {stop_token})
        assert s.sampled_logprobs == pytest.approx(f.sampled_logprobs[: len(s.response_token_ids)], abs=1e-5)
        ended = s.response_token_ids[-1] == stop_token
        assert s.finish_reason == ("eos" if ended else "length")
        assert s.response_token_count == len(s.response_token_ids) - int(ended)
        assert stop_token not in s.response_token_ids[:-1]


def test_stops_on_the_model_configured_eos_even_if_the_tokenizer_misreports_it(tok: Any) -> None:
    # SmolLM2's GGUF tokenizer says eos is <|im_start|>; only the model config has the right id.
    model = make_tiny_llama(tok, seed=2)
    wrong = make_tiny_tokenizer()
    wrong.eos_token = "<|im_start|>"
    assert resolve_eos_ids(model, wrong) == [3, 4]
    free = _gen(model, wrong, [SHORT], samples_per_prompt=1, max_new_tokens=16)[0]
    stop_token = next(x for x in free.response_token_ids[1:] if x not in (3, 4))
    model.generation_config.eos_token_id = [4, stop_token]
    stopped = _gen(model, wrong, [SHORT], samples_per_prompt=1, max_new_tokens=16)[0]
    assert stopped.finish_reason == "eos"
    assert stopped.response_token_ids == _cut_at_first(free.response_token_ids, {3, 4, stop_token})


def test_max_new_tokens_stop(llama: Any, tok: Any) -> None:
    for n in (1, 5):
        out = _gen(llama, tok, [SHORT, LONG], max_new_tokens=n, eos_token_ids=[0])
        assert [len(t.response_token_ids) for t in out] == [n] * 4
        assert {t.finish_reason for t in out} == {"length"}
    long = _gen(llama, tok, [SHORT], max_new_tokens=12, eos_token_ids=[0])
    assert all(s.response_token_ids == g.response_token_ids[:5] for s, g in zip(out[:2], long, strict=True))


def test_chat_template_and_plain_prompts(llama: Any, tok: Any) -> None:
    rendered = tok.apply_chat_template([{"role": "user", "content": SHORT.prompt}], add_generation_prompt=True,
                                       tokenize=False)  # fmt: skip
    assert rendered.endswith("<|im_start|>assistant\n")
    templated = _gen(llama, tok, [SHORT], samples_per_prompt=1, max_new_tokens=2)[0]
    assert list(templated.prompt_token_ids) == tok(rendered, add_special_tokens=False)["input_ids"]
    plain = _gen(llama, tok, [SHORT], samples_per_prompt=1, max_new_tokens=2, use_chat_template=False)[0]
    assert list(plain.prompt_token_ids) == tok(SHORT.prompt)["input_ids"]
    no_template = make_tiny_tokenizer(chat_template=False)
    assert encode_prompt(no_template, SHORT.prompt) == list(plain.prompt_token_ids)


def test_training_mode_is_restored_and_no_grad_is_kept(tok: Any) -> None:
    model = make_tiny_llama(tok, seed=0)
    model.train()
    out = _gen(model, tok, [SHORT], max_new_tokens=3)
    assert model.training and all(m.training for m in model.modules())
    assert len(out) == 2
    model.eval()
    _gen(model, tok, [SHORT], max_new_tokens=3)
    assert not model.training
    assert all(p.grad is None for p in model.parameters())


def test_peft_lora_actor(tok: Any) -> None:
    peft = pytest.importorskip("peft")
    base = make_tiny_llama(tok, seed=0)
    plain = _gen(base, tok, [SHORT], max_new_tokens=6)
    actor = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    actor.train()
    out = _gen(actor, tok, [SHORT], max_new_tokens=6)
    assert actor.training
    # LoRA starts with B = 0, so the actor samples exactly what the base model samples
    assert [t.response_token_ids for t in out] == [t.response_token_ids for t in plain]


def test_trajectory_to_record(llama: Any, tok: Any) -> None:
    t = _gen(llama, tok, [SHORT], max_new_tokens=4)[0]
    record = TrajectoryRecord.from_trajectory(t, reward=0.5, reward_components={"target_length": 0.5})
    assert record.prompt_token_ids == list(t.prompt_token_ids)
    assert record.sampled_logprobs == list(t.sampled_logprobs)
    assert (record.group_id, record.seed, record.finish_reason) == (t.group_id, t.seed, t.finish_reason)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"samples_per_prompt": 0}, "samples_per_prompt"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_arguments(llama: Any, tok: Any, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _gen(llama, tok, [SHORT], **kw)


def test_duplicate_prompt_ids_refused(llama: Any, tok: Any) -> None:
    with pytest.raises(UsageError, match="unique"):
        _gen(llama, tok, [SHORT, PromptInput("a", "other")])
