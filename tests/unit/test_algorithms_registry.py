"""Registries, name lookup, and the import contract (``miniverl`` alone never imports torch)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import miniverl.algorithms as alg
from miniverl.algorithms import (
    ADVANTAGE_ESTIMATORS,
    DISTILL_OBJECTIVES,
    DIVERGENCES,
    POLICY_LOSSES,
    DistillObjective,
    get,
)


def test_registries_name_the_implementations():
    assert get(ADVANTAGE_ESTIMATORS, "grpo") is alg.grpo_advantages
    assert get(ADVANTAGE_ESTIMATORS, "gae") is alg.gae_advantages
    assert get(POLICY_LOSSES, "ppo_clip") is alg.ppo_clip_loss
    assert set(DIVERGENCES) == {"forward_kl", "reverse_kl", "jsd"} == set(alg.DIVERGENCE_KINDS)


def test_get_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown name 'grpoo'; valid names: gae, grpo"):
        get(ADVANTAGE_ESTIMATORS, "grpoo")
    with pytest.raises(ValueError, match="valid names: ppo_clip"):
        get(POLICY_LOSSES, ["not", "hashable"])  # type: ignore[arg-type]


def test_distill_objectives_describe_each_variant():
    expected = {
        "opd_exact": ("reverse_kl", "exact", None, True),
        "opd_topk_tail": ("reverse_kl", "topk_tail", 64, True),
        "kd_exact": ("forward_kl", "exact", None, False),
        "kd_topk_tail": ("forward_kl", "topk_tail", 64, False),
        "sft": ("nll", "token", None, False),
        "gkd_forward_kl_topk": ("forward_kl", "topk", 64, True),
    }
    assert set(DISTILL_OBJECTIVES) == set(expected)
    for name, (div, support, k, on_policy) in expected.items():
        obj = get(DISTILL_OBJECTIVES, name)
        assert isinstance(obj, DistillObjective) and obj.name == name
        assert (obj.divergence, obj.support, obj.default_k, obj.on_policy) == (div, support, k, on_policy)
        assert obj.divergence == "nll" or obj.divergence in DIVERGENCES
    with pytest.raises(dataclasses.FrozenInstanceError):
        DISTILL_OBJECTIVES["sft"].default_k = 3  # type: ignore[misc]


def test_public_api_is_exported():
    for name in alg.__all__:
        assert hasattr(alg, name), name
    for name in (
        "grpo_advantages",
        "ppo_clip_loss",
        "k3_kl",
        "chunked_token_logprobs",
        "chunked_divergence",
        "teacher_topk_targets",
        "chunked_topk_tail_divergence",
        "forward_kl_topk",
        "sft_token_nll",
        "masked_token_mean",
        "masked_sequence_mean",
    ):
        assert name in alg.__all__


def test_import_contract():
    code = (
        "import sys, miniverl\n"
        "assert 'torch' not in sys.modules, 'importing miniverl must not import torch'\n"
        "import miniverl.algorithms\n"
        "assert 'torch' in sys.modules\n"
        "heavy = [m for m in ('transformers', 'peft') if m in sys.modules]\n"
        "assert not heavy, f'miniverl.algorithms must import only torch, got {heavy}'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
