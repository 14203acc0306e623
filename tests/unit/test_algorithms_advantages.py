"""GRPO and GAE advantages against hand-computed values and float64 brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from miniverl.algorithms import gae_advantages, grpo_advantages, masked_whiten


def test_grpo_hand_computed_example():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 2.0, 4.0], dtype=torch.float64)
    groups = ["a", "a", "a", "a", "solo", "b", "b"]
    adv = grpo_advantages(scores, groups)
    # group a: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    sa = math.sqrt(1 / 3) + 1e-6
    # group b: mean 3, unbiased std sqrt(2 / 1) = sqrt(2)  (the biased one would be 1)
    sb = math.sqrt(2) + 1e-6
    expected = [0.5 / sa, -0.5 / sa, 0.5 / sa, -0.5 / sa, 5.0 / (1 + 1e-6), -1 / sb, 1 / sb]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)


def test_grpo_norm_by_std_false_only_centres():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 2.0, 4.0])
    adv = grpo_advantages(scores, [0, 0, 0, 0, 1, 2, 2], norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, -0.5, 5.0, -1.0, 1.0]))


def test_grpo_singleton_groups_follow_verl():
    """verl: singleton mean 0, std 1, so the advantage is the raw score (over 1 + eps), not 0."""
    scores = torch.tensor([3.0, -2.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(grpo_advantages(scores, ["x", "y", "z"], eps=0.0), scores, rtol=0, atol=0)
    torch.testing.assert_close(grpo_advantages(scores, [1, 2, 3], eps=0.5), scores / 1.5, rtol=1e-15, atol=0)
    torch.testing.assert_close(grpo_advantages(scores, [1, 2, 3], norm_by_std=False), scores, rtol=0, atol=0)


def test_grpo_matches_torch_std_brute_force_with_shuffled_groups():
    g = torch.Generator().manual_seed(0)
    n = 37
    scores = torch.randn(n, generator=g, dtype=torch.float64) * 3
    groups = [int(x) for x in torch.randint(0, 6, (n,), generator=g)]
    groups[0] = 99  # a singleton somewhere
    adv = grpo_advantages(scores, groups, eps=1e-6)
    for i in range(n):
        members = torch.stack([scores[j] for j in range(n) if groups[j] == groups[i]])
        if len(members) == 1:
            ref = scores[i] / (1 + 1e-6)
        else:
            ref = (scores[i] - members.mean()) / (torch.std(members) + 1e-6)
        torch.testing.assert_close(adv[i], ref, rtol=1e-12, atol=1e-12)
    # per-group advantages sum to 0 (non-singleton groups)
    for gid in set(groups) - {99}:
        idx = [j for j in range(n) if groups[j] == gid]
        if len(idx) > 1:
            assert abs(float(adv[idx].sum())) < 1e-9


def test_grpo_equal_scores_give_zero_and_ids_compare_by_value():
    scores = torch.tensor([1.0, 1.0, 1.0, 2.0, 0.0])
    adv = grpo_advantages(scores, np.array(["p", "p", "p", "q", "q"]))
    torch.testing.assert_close(adv[:3], torch.zeros(3))
    same = grpo_advantages(scores, torch.tensor([7, 7, 7, 8, 8]))
    torch.testing.assert_close(adv, same)
    assert adv.dtype == torch.float32
    # group ids given as a tuple of mixed hashables
    mixed = grpo_advantages(scores, (("p", 1), ("p", 1), ("p", 1), None, None))
    torch.testing.assert_close(mixed, adv)


def test_grpo_validates_inputs():
    with pytest.raises(ValueError, match="3 scores but 2 group ids"):
        grpo_advantages(torch.zeros(3), ["a", "b"])
    with pytest.raises(ValueError, match="1-D"):
        grpo_advantages(torch.zeros(2, 2), ["a", "b"])


def test_grpo_integer_scores_become_float():
    adv = grpo_advantages(torch.tensor([1, 0]), ["a", "a"], norm_by_std=False)
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]))


# --------------------------------------------------------------------------- GAE
def gae_brute_force(rewards, values, mask, gamma, lam):
    n, t_len = rewards.shape
    adv = torch.zeros_like(rewards)
    ret = torch.zeros_like(rewards)
    for i in range(n):
        pos = [t for t in range(t_len) if mask[i, t]]
        for a, t in enumerate(pos):
            total = 0.0
            for b in range(a, len(pos)):
                nxt = values[i, pos[b + 1]] if b + 1 < len(pos) else 0.0
                delta = rewards[i, pos[b]] + gamma * nxt - values[i, pos[b]]
                total += (gamma * lam) ** (b - a) * delta
            adv[i, t] = total
            ret[i, t] = total + values[i, t]
    return adv, ret


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0)])
def test_gae_matches_brute_force_with_holes_and_padding(gamma, lam):
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(4, 7, generator=g, dtype=torch.float64)
    values = torch.randn(4, 7, generator=g, dtype=torch.float64)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0, 0]], dtype=torch.bool
    )
    garbage_r = torch.where(mask, rewards, torch.full_like(rewards, 1e6))
    garbage_v = torch.where(mask, values, torch.full_like(values, -1e6))
    adv, ret = gae_advantages(garbage_r, garbage_v, mask.float(), gamma=gamma, lam=lam, whiten=False)
    ref_adv, ref_ret = gae_brute_force(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, ref_ret, rtol=1e-12, atol=1e-12)
    assert bool((adv[~mask] == 0).all()) and bool((ret[~mask] == 0).all())

    white, ret2 = gae_advantages(garbage_r, garbage_v, mask, gamma=gamma, lam=lam, whiten=True)
    sel = ref_adv[mask]
    torch.testing.assert_close(white[mask], (sel - sel.mean()) / torch.sqrt(sel.var() + 1e-8), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ret2, ref_ret, rtol=1e-12, atol=1e-12)


def test_gae_outcome_reward_with_lambda_one_is_return_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.5, 0.9]], dtype=torch.float64)
    adv, ret = gae_advantages(rewards, values, torch.ones(1, 3), whiten=False)
    torch.testing.assert_close(ret, torch.ones(1, 3, dtype=torch.float64))
    torch.testing.assert_close(adv, 1.0 - values)


def test_masked_whiten_shift_mean_false_keeps_mean():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0]])
    out = masked_whiten(x, m, shift_mean=False)
    torch.testing.assert_close(out, torch.tensor([[1.0, 2.0, 3.0, 0.0]], dtype=torch.float64), rtol=1e-7, atol=1e-7)
