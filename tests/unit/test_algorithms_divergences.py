"""Divergences (exact, top-k + tail, GKD top-k) against float64 brute force built from full logits."""

from __future__ import annotations

import math

import pytest
import torch

from miniverl.algorithms import (
    chunked_divergence,
    chunked_topk_tail_divergence,
    forward_kl_topk,
    jsd,
    teacher_topk_targets,
)

KINDS = ["forward_kl", "reverse_kl", "jsd"]
# (N, V, Hs, Ht, chunk_size, temperature): teacher and student hidden sizes may differ.
CASES = [
    (1, 7, 3, 3, 1, 1.0),
    (5, 11, 4, 6, 2, 0.7),
    (13, 17, 6, 5, 4, 1.3),
    (9, 10, 3, 4, 1024, 2.0),
]


def make(n, v, hs, ht, seed):
    g = torch.Generator().manual_seed(seed)
    d = torch.float64
    return (
        torch.randn(n, hs, generator=g, dtype=d) * 1.5,
        torch.randn(v, hs, generator=g, dtype=d),
        torch.randn(n, ht, generator=g, dtype=d) * 1.5,
        torch.randn(v, ht, generator=g, dtype=d),
    )


def ref_from_probs(p_s, p_t, kind, beta=0.5):
    """Divergence written directly in probability space over the last dim (independent formulation)."""
    if kind == "forward_kl":
        return (p_t * (p_t.log() - p_s.log())).sum(-1)
    if kind == "reverse_kl":
        return (p_s * (p_s.log() - p_t.log())).sum(-1)
    m = beta * p_t + (1 - beta) * p_s
    return beta * (p_t * (p_t / m).log()).sum(-1) + (1 - beta) * (p_s * (p_s / m).log()).sum(-1)


def full_probs(hidden, head, temperature):
    return torch.softmax(hidden @ head.T / temperature, dim=-1)  # full [N, V]: reference only


def grads_of(fn, *leaves, weights):
    leaves = [x.clone().requires_grad_() for x in leaves]
    out = fn(*leaves)
    (out * weights).sum().backward()
    return out.detach(), [x.grad for x in leaves]


# ----------------------------------------------------------------------------------- exact
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "v", "hs", "ht", "chunk", "temp"), CASES)
def test_exact_matches_brute_force(kind, n, v, hs, ht, chunk, temp):
    sh, sw, th, tw = make(n, v, hs, ht, seed=n + v)
    beta = 0.3 if kind == "jsd" else 0.5
    w = torch.rand(n, dtype=torch.float64) + 0.5

    def lib(a, b):
        return chunked_divergence(a, b, th, tw, kind=kind, beta=beta, temperature=temp, chunk_size=chunk)

    def ref(a, b):
        return ref_from_probs(full_probs(a, b, temp), full_probs(th, tw, temp), kind, beta)

    out, (gh, gw) = grads_of(lib, sh, sw, weights=w)
    ref_out, (rgh, rgw) = grads_of(ref, sh, sw, weights=w)
    assert out.dtype == torch.float64 and out.shape == (n,)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gh, rgh, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gw, rgw, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", KINDS)
def test_teacher_gets_no_gradient_and_divergence_is_nonnegative(kind):
    sh, sw, th, tw = make(6, 12, 4, 4, seed=11)
    sh.requires_grad_()
    th.requires_grad_()
    tw.requires_grad_()
    out = chunked_divergence(sh, sw, th, tw, kind=kind, chunk_size=4)
    out.sum().backward()
    assert th.grad is None and tw.grad is None
    assert sh.grad is not None and bool(sh.grad.abs().sum() > 0)
    assert bool((out > 0).all())


@pytest.mark.parametrize("kind", KINDS)
def test_zero_when_student_equals_teacher(kind):
    sh, sw, _, _ = make(5, 9, 3, 3, seed=12)
    out = chunked_divergence(sh, sw, sh, sw, kind=kind, chunk_size=2, temperature=0.8)
    torch.testing.assert_close(out, torch.zeros(5, dtype=torch.float64), rtol=0, atol=1e-14)


def test_forward_and_reverse_kl_differ_and_are_swaps_of_each_other():
    sh, sw, th, tw = make(4, 8, 3, 3, seed=13)
    fwd = chunked_divergence(sh, sw, th, tw, kind="forward_kl")
    rev = chunked_divergence(sh, sw, th, tw, kind="reverse_kl")
    assert not torch.allclose(fwd, rev)
    torch.testing.assert_close(chunked_divergence(th, tw, sh, sw, kind="reverse_kl"), fwd, rtol=1e-12, atol=0)


def test_jsd_half_is_symmetric_and_bounded_by_log2():
    sh, sw, th, tw = make(7, 10, 3, 3, seed=14)
    a = chunked_divergence(sh * 4, sw, th * 4, tw, kind="jsd", beta=0.5, chunk_size=3)
    b = chunked_divergence(th * 4, tw, sh * 4, sw, kind="jsd", beta=0.5, chunk_size=3)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert bool((a > 0).all()) and bool((a <= math.log(2) + 1e-12).all())
    c = chunked_divergence(sh, sw, th, tw, kind="jsd", beta=0.2)
    d = chunked_divergence(th, tw, sh, sw, kind="jsd", beta=0.8)
    torch.testing.assert_close(c, d, rtol=1e-12, atol=1e-14)  # swapping roles swaps beta and 1 - beta


def test_jsd_beta_convention_limits():
    """beta weights the teacher: JSD_b / b -> KL(t||s) as b -> 0 and JSD_b / (1 - b) -> KL(s||t) as b -> 1."""
    sh, sw, th, tw = make(5, 9, 3, 3, seed=15)
    fwd = chunked_divergence(sh, sw, th, tw, kind="forward_kl")
    rev = chunked_divergence(sh, sw, th, tw, kind="reverse_kl")
    eps = 1e-9  # convergence is first order in beta (slow where p_t / p_s is large)
    lo = chunked_divergence(sh, sw, th, tw, kind="jsd", beta=eps) / eps
    hi = chunked_divergence(sh, sw, th, tw, kind="jsd", beta=1 - eps) / eps
    torch.testing.assert_close(lo, fwd, rtol=1e-4, atol=1e-8)
    torch.testing.assert_close(hi, rev, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.1, 1.5])
def test_jsd_degenerate_beta_is_refused(beta):
    sh, sw, th, tw = make(2, 5, 3, 3, seed=16)
    with pytest.raises(ValueError, match="forward_kl"):
        chunked_divergence(sh, sw, th, tw, kind="jsd", beta=beta)
    with pytest.raises(ValueError, match="beta"):
        jsd(torch.zeros(3), torch.zeros(3), beta)


def test_unknown_kind_and_shape_mismatch_are_refused():
    sh, sw, th, tw = make(3, 6, 2, 2, seed=17)
    with pytest.raises(ValueError, match="valid kinds: forward_kl, reverse_kl, jsd"):
        chunked_divergence(sh, sw, th, tw, kind="kl")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same rows"):
        chunked_divergence(sh, sw, th[:2], tw, kind="forward_kl")
    with pytest.raises(ValueError, match="same rows"):
        chunked_divergence(sh, sw, th, tw[:5], kind="forward_kl")


def test_float32_result_for_low_precision_inputs():
    sh, sw, th, tw = make(4, 8, 3, 3, seed=18)
    out = chunked_divergence(sh.bfloat16(), sw.bfloat16(), th.float(), tw.float(), kind="reverse_kl")
    assert out.dtype == torch.float32
    ref = chunked_divergence(sh.bfloat16().double(), sw.bfloat16().double(), th, tw, kind="reverse_kl")
    torch.testing.assert_close(out.double(), ref, rtol=0.05, atol=0.02)


# ----------------------------------------------------------------------------------- top-k
def test_teacher_topk_targets_match_full_softmax():
    _, _, th, tw = make(11, 20, 3, 5, seed=19)
    ids, lps = teacher_topk_targets(th.requires_grad_(), tw, k=4, temperature=1.7, chunk_size=3)
    full = torch.log_softmax(th.detach() @ tw.T / 1.7, dim=-1)
    ref = torch.topk(full, 4, dim=-1)
    assert ids.dtype == torch.long and ids.shape == (11, 4) and not lps.requires_grad
    assert torch.equal(ids, ref.indices)
    torch.testing.assert_close(lps, ref.values, rtol=1e-12, atol=1e-12)
    assert bool((lps[:, :-1] >= lps[:, 1:]).all())
    with pytest.raises(ValueError, match="k must be"):
        teacher_topk_targets(th, tw, k=21)
    with pytest.raises(ValueError, match="k must be"):
        teacher_topk_targets(th, tw, k=0)


def ref_topk_tail(s_probs, t_probs, ids, kind, beta):
    in_k = torch.zeros_like(s_probs, dtype=torch.bool).scatter(1, ids, True)
    s_b = torch.cat([s_probs.gather(1, ids), (s_probs * ~in_k).sum(-1, keepdim=True)], dim=1)
    t_b = torch.cat([t_probs.gather(1, ids), (t_probs * ~in_k).sum(-1, keepdim=True)], dim=1)
    return ref_from_probs(s_b, t_b, kind, beta)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("n", "v", "k", "chunk", "temp"), [(1, 6, 2, 1, 1.0), (9, 13, 4, 2, 0.8), (12, 9, 1, 5, 1.5)])
def test_topk_tail_matches_brute_force(kind, n, v, k, chunk, temp):
    sh, sw, th, tw = make(n, v, 3, 4, seed=20 + n)
    ids, t_lps = teacher_topk_targets(th, tw, k=k, temperature=temp)
    beta = 0.6 if kind == "jsd" else 0.5
    w = torch.rand(n, dtype=torch.float64) + 0.5

    def lib(a, b):
        return chunked_topk_tail_divergence(a, b, ids, t_lps, kind=kind, beta=beta, temperature=temp, chunk_size=chunk)

    def ref(a, b):
        return ref_topk_tail(full_probs(a, b, temp), full_probs(th, tw, temp), ids, kind, beta)

    out, (gh, gw) = grads_of(lib, sh, sw, weights=w)
    ref_out, (rgh, rgw) = grads_of(ref, sh, sw, weights=w)
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(gh, rgh, rtol=1e-8, atol=1e-11)
    torch.testing.assert_close(gw, rgw, rtol=1e-8, atol=1e-11)
    assert bool((out >= -1e-14).all())
    # a top-k restriction can only lose information: bucket divergence <= full divergence
    full = chunked_divergence(sh, sw, th, tw, kind=kind, beta=beta, temperature=temp)
    assert bool((out <= full + 1e-12).all())


@pytest.mark.parametrize("kind", KINDS)
def test_topk_tail_with_k_equal_v_equals_exact_including_grads(kind):
    n, v = 7, 10
    sh, sw, th, tw = make(n, v, 4, 3, seed=30)
    ids, t_lps = teacher_topk_targets(th, tw, k=v, temperature=1.2)
    w = torch.rand(n, dtype=torch.float64) + 0.5

    def topk(a, b):
        return chunked_topk_tail_divergence(a, b, ids, t_lps, kind=kind, temperature=1.2, chunk_size=3)

    def exact(a, b):
        return chunked_divergence(a, b, th, tw, kind=kind, temperature=1.2, chunk_size=3)

    out, (gh, gw) = grads_of(topk, sh, sw, weights=w)
    ref, (rgh, rgw) = grads_of(exact, sh, sw, weights=w)
    assert torch.isfinite(gh).all() and torch.isfinite(gw).all()
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gh, rgh, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gw, rgw, rtol=1e-9, atol=1e-11)


def test_topk_tail_is_zero_when_student_equals_teacher_and_float32_is_finite():
    sh, sw, _, _ = make(6, 12, 3, 3, seed=31)
    for k in (1, 5, 12):
        ids, lps = teacher_topk_targets(sh, sw, k=k)
        for kind in KINDS:
            out = chunked_topk_tail_divergence(sh, sw, ids, lps, kind=kind, chunk_size=4)
            torch.testing.assert_close(out, torch.zeros(6, dtype=torch.float64), rtol=0, atol=1e-13)
    # float32, a very peaked teacher whose top-1 holds all the mass up to rounding: still finite
    peaked = sh.float() * 200
    ids, lps = teacher_topk_targets(peaked, sw.float(), k=1)
    s = sh.float().clone().requires_grad_()
    out = chunked_topk_tail_divergence(s, sw.float(), ids, lps, kind="reverse_kl")
    out.sum().backward()
    assert out.dtype == torch.float32 and torch.isfinite(out).all() and torch.isfinite(s.grad).all()


def test_topk_inputs_are_validated():
    sh, sw, th, tw = make(3, 6, 2, 2, seed=32)
    ids, lps = teacher_topk_targets(th, tw, k=2)
    with pytest.raises(ValueError, match="repeated id"):
        chunked_topk_tail_divergence(sh, sw, ids[:, [0, 0]], lps, kind="forward_kl")
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        chunked_topk_tail_divergence(sh, sw, ids + 6, lps, kind="forward_kl")
    with pytest.raises(ValueError, match=r"\[N, k\]"):
        forward_kl_topk(sh, sw, ids[:2], lps[:2])
    with pytest.raises(ValueError, match=r"\[N, k\]"):
        forward_kl_topk(sh, sw, ids, lps[:, :1])


# ----------------------------------------------------------------------------------- GKD top-k
@pytest.mark.parametrize(("n", "v", "k", "chunk", "temp"), [(1, 5, 2, 1, 1.0), (10, 14, 3, 4, 0.9), (6, 8, 8, 2, 1.4)])
def test_forward_kl_topk_matches_brute_force(n, v, k, chunk, temp):
    sh, sw, th, tw = make(n, v, 4, 3, seed=40 + k)
    ids, t_lps = teacher_topk_targets(th, tw, k=k, temperature=temp)
    w = torch.rand(n, dtype=torch.float64) + 0.5

    def lib(a, b):
        return forward_kl_topk(a, b, ids, t_lps, temperature=temp, chunk_size=chunk)

    def ref(a, b):
        p_s = full_probs(a, b, temp).gather(1, ids)  # student NOT renormalized
        p_t = full_probs(th, tw, temp).gather(1, ids)
        p_t = p_t / p_t.sum(-1, keepdim=True)  # teacher top-k renormalized
        return (p_t * (p_t.log() - p_s.log())).sum(-1)

    out, (gh, gw) = grads_of(lib, sh, sw, weights=w)
    ref_out, (rgh, rgw) = grads_of(ref, sh, sw, weights=w)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gh, rgh, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(gw, rgw, rtol=1e-9, atol=1e-11)
    assert bool((out > 0).all())
    if k == v:
        exact = chunked_divergence(sh, sw, th, tw, kind="forward_kl", temperature=temp)
        torch.testing.assert_close(out, exact, rtol=1e-10, atol=1e-12)


def test_forward_kl_topk_penalizes_mass_outside_topk():
    """Student matching the renormalized teacher on K but leaking mass outside K has loss -log(mass on K)."""
    v = 6
    head = torch.eye(v, dtype=torch.float64)
    ids = torch.tensor([[0, 1]])
    t_lps = torch.log(torch.tensor([[0.6, 0.2]], dtype=torch.float64))  # renormalized: 0.75, 0.25
    probs = torch.tensor([0.375, 0.125, 0.125, 0.125, 0.125, 0.125], dtype=torch.float64)  # 0.5 on K, 3:1
    loss = forward_kl_topk(probs.log().unsqueeze(0), head, ids, t_lps)
    torch.testing.assert_close(loss, torch.tensor([math.log(2.0)], dtype=torch.float64), rtol=1e-12, atol=0)


def test_zero_rows_give_empty_results_that_still_backpropagate():
    sh, sw, th, tw = make(0, 6, 3, 3, seed=50)
    sw.requires_grad_()
    ids, lps = teacher_topk_targets(th, tw, k=2)
    assert ids.shape == (0, 2) and lps.shape == (0, 2)
    outs = [
        chunked_divergence(sh, sw, th, tw, kind="reverse_kl"),
        chunked_topk_tail_divergence(sh, sw, ids, lps, kind="forward_kl"),
        forward_kl_topk(sh, sw, ids, lps),
    ]
    for out in outs:
        assert out.shape == (0,) and out.requires_grad
    sum(o.sum() for o in outs).backward()
    assert torch.equal(sw.grad, torch.zeros_like(sw))
