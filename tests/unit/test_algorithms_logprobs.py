"""chunked_token_logprobs / sft_token_nll against a float64 brute force built from full logits."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from miniverl.algorithms import _chunking, chunked_token_logprobs, sft_token_nll

# (N, V, H, chunk_size, temperature): chunk sizes that do not divide N, N=1, chunk > N, T != 1.
CASES = [
    (1, 7, 3, 1, 1.0),
    (5, 11, 4, 2, 0.7),
    (13, 17, 6, 4, 1.3),
    (8, 9, 5, 8, 2.0),
    (3, 5, 2, 1024, 1.0),
    (10, 23, 8, 3, 0.5),
]


def make_inputs(n: int, v: int, h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64) * 2.0
    head = torch.randn(v, h, generator=g, dtype=torch.float64)
    ids = torch.randint(0, v, (n,), generator=g)
    return hidden, head, ids


def brute_force(hidden, head, ids, temperature):
    logits = hidden @ head.T / temperature  # full [N, V]: allowed in the reference only
    logp = torch.log_softmax(logits, dim=-1)
    p = torch.softmax(logits, dim=-1)
    return logp[torch.arange(len(ids)), ids], -(p * logp).sum(-1)


@pytest.mark.parametrize(("n", "v", "h", "chunk", "temp"), CASES)
def test_values_and_grads_match_brute_force(n, v, h, chunk, temp):
    hidden, head, ids = make_inputs(n, v, h, seed=n * 100 + v)
    weights = torch.randn(n, dtype=torch.float64)

    h1, w1 = hidden.clone().requires_grad_(), head.clone().requires_grad_()
    logp, ent = chunked_token_logprobs(h1, w1, ids, temperature=temp, chunk_size=chunk, with_entropy=True)
    assert ent is not None and not ent.requires_grad  # a metric: no graph behind it
    assert logp.dtype == torch.float64 and logp.shape == (n,)
    (logp * weights).sum().backward()

    h2, w2 = hidden.clone().requires_grad_(), head.clone().requires_grad_()
    ref_logp, ref_ent = brute_force(h2, w2, ids, temp)
    (ref_logp * weights).sum().backward()

    torch.testing.assert_close(logp, ref_logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(w1.grad, w2.grad, rtol=1e-10, atol=1e-12)


def test_without_entropy_returns_none_and_same_logprobs():
    hidden, head, ids = make_inputs(6, 10, 4, seed=1)
    a, none = chunked_token_logprobs(hidden, head, ids, chunk_size=4)
    b, ent = chunked_token_logprobs(hidden, head, ids, chunk_size=4, with_entropy=True)
    assert none is None and ent is not None
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert bool((ent >= 0).all()) and bool((ent <= torch.log(torch.tensor(10.0, dtype=ent.dtype))).all())


def test_temperature_changes_result():
    hidden, head, ids = make_inputs(4, 9, 3, seed=2)
    a, _ = chunked_token_logprobs(hidden, head, ids)
    b, _ = chunked_token_logprobs(hidden, head, ids, temperature=2.0)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, brute_force(hidden, head, ids, 2.0)[0], rtol=1e-12, atol=1e-12)


def test_low_precision_inputs_are_upcast_to_float32():
    hidden, head, ids = make_inputs(7, 12, 8, seed=3)
    logp, ent = chunked_token_logprobs(
        hidden.to(torch.bfloat16), head.to(torch.bfloat16), ids, chunk_size=3, with_entropy=True
    )
    assert logp.dtype == torch.float32 and ent is not None and ent.dtype == torch.float32
    ref, _ = brute_force(hidden.to(torch.bfloat16).double(), head.to(torch.bfloat16).double(), ids, 1.0)
    torch.testing.assert_close(logp.double(), ref, rtol=0.05, atol=0.1)
    logp32, _ = chunked_token_logprobs(hidden.float(), head.float(), ids)
    assert logp32.dtype == torch.float32
    torch.testing.assert_close(logp32.double(), brute_force(hidden, head, ids, 1.0)[0], rtol=1e-5, atol=1e-5)


def test_projection_is_chunked_and_checkpointed(monkeypatch):
    """Only [<=chunk, V] logits are ever built; with grad, each chunk is recomputed in backward."""
    shapes: list[tuple[int, ...]] = []
    real = _chunking.tempered_logits

    def spy(hidden, head_weight, temperature, dtype):
        out = real(hidden, head_weight, temperature, dtype)
        shapes.append(tuple(out.shape))
        return out

    import miniverl.algorithms.logprobs as lp_mod

    monkeypatch.setattr(lp_mod, "tempered_logits", spy)
    hidden, head, ids = make_inputs(10, 13, 4, seed=4)
    n_chunks = 4  # ceil(10 / 3)

    with torch.no_grad():
        chunked_token_logprobs(hidden, head, ids, chunk_size=3)
    assert len(shapes) == n_chunks and all(s[0] <= 3 and s[1] == 13 for s in shapes)

    shapes.clear()
    h = hidden.clone().requires_grad_()
    logp, _ = chunked_token_logprobs(h, head, ids, chunk_size=3)
    assert len(shapes) == n_chunks
    logp.sum().backward()
    assert len(shapes) == 2 * n_chunks, "backward should recompute each checkpointed chunk once"
    assert all(s[0] <= 3 for s in shapes)


def test_sft_token_nll_is_cross_entropy():
    hidden, head, ids = make_inputs(9, 15, 5, seed=5)
    nll = sft_token_nll(hidden, head, ids, chunk_size=4)
    ref = torch.nn.functional.cross_entropy(hidden @ head.T, ids, reduction="none")
    torch.testing.assert_close(nll, ref, rtol=1e-12, atol=1e-12)
    assert bool((nll > 0).all())


def test_empty_rows():
    hidden, head, _ = make_inputs(0, 5, 3, seed=6)
    logp, ent = chunked_token_logprobs(hidden, head, torch.zeros(0, dtype=torch.long), with_entropy=True)
    assert logp.shape == (0,) and ent is not None and ent.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    hidden, head, ids = make_inputs(3, 5, 2, seed=7)
    with pytest.raises(ValueError, match=match):
        chunked_token_logprobs(hidden, head, ids, **kwargs)


def test_bad_shapes_are_refused():
    hidden, head, ids = make_inputs(3, 5, 2, seed=8)
    with pytest.raises(ValueError, match="2-D"):
        chunked_token_logprobs(hidden.unsqueeze(0), head, ids)
    with pytest.raises(ValueError, match=r"\[V, H\]"):
        chunked_token_logprobs(hidden, head[:, :1], ids)
    with pytest.raises(ValueError, match="token_ids"):
        chunked_token_logprobs(hidden, head, ids[:2])
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        chunked_token_logprobs(hidden, head, torch.tensor([0, 1, 5]))


class _LiveLogitsPeak(TorchDispatchMode):
    """The most ``[rows, V]``-sized tensors (``rows > 1``) alive at once while the mode is on, by weakref."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.live, self.peak = vocab, 0, 0

    def _gone(self) -> None:
        self.live -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[0] > 1 and t.shape[1] == self.vocab:
                self.live += 1
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._gone)
        return out


def test_backward_with_entropy_holds_one_chunk_of_logits_at_a_time():
    """The entropy (a metric) must not make backward keep every recomputed chunk's [chunk, V] tensors:
    with grad on the entropy branch, all 8 chunks' log-softmax and exp outputs stayed alive until the
    end of backward (4.3 GiB at Qwen3's vocabulary, seen on the H200)."""
    vocab, chunks = 97, 8
    hidden, head, ids = make_inputs(4 * chunks, vocab, 6, seed=5)
    h = hidden.clone().requires_grad_()
    with _LiveLogitsPeak(vocab) as forward_mode:
        logp, ent = chunked_token_logprobs(h, head, ids, chunk_size=4, with_entropy=True)
    assert ent is not None
    with _LiveLogitsPeak(vocab) as backward_mode:
        logp.sum().backward()
    assert forward_mode.peak <= 4, forward_mode.peak
    # one chunk's recomputation and its grads (5 here), however many chunks there are (29 with the leak)
    assert backward_mode.peak <= 6, f"{backward_mode.peak} [chunk, V] tensors alive at once in backward"
