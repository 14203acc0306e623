"""grpo_update keeps its statistics on the device until one read: the loss, KL, entropy, clip fraction,
ppo_kl and the gradients equal those of the per-batch host-read loop it replaced, bit for bit."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from miniverl.algorithms import chunked_token_logprobs, clip_fraction, kl_penalty, ppo_clip_token_losses
from miniverl.config.schema import GrpoSection, ModelsSection
from miniverl.gate.models import RandomModelLoader
from miniverl.runtime import build_runtime
from miniverl.training.algorithms.grpo import grpo_update
from miniverl.training.update import UpdateSequence, UpdateStats, physical_batches, rows_of, targets_of

CPU = torch.device("cpu")


def _runtime() -> Any:
    models = ModelsSection.model_validate(
        {
            "student": {"source": "local", "path": "tiny", "lora": {"r": 4, "alpha": 8}},
            "reference": {"source": "student"},
        }
    )
    runtime = build_runtime(models, device=CPU, loader=RandomModelLoader("tiny"))
    with torch.no_grad():  # LoRA B starts at 0: move the student off its reference
        gen = torch.Generator().manual_seed(3)
        for name, param in runtime.named_trainable_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return runtime


def _sequences() -> list[UpdateSequence]:
    gen = torch.Generator().manual_seed(5)
    out = []
    for i, (prompt, response) in enumerate([(5, 4), (3, 6), (7, 2), (4, 5), (6, 3)]):
        ids = tuple(int(t) for t in torch.randint(3, 60, (prompt + response,), generator=gen))
        out.append(UpdateSequence(ids, prompt, None, None, response, advantage=(-1.0) ** i * (0.3 + 0.1 * i)))
    return out


def _reference_update(runtime: Any, sequences: list[UpdateSequence], config: Any, old_logp: Any) -> UpdateStats:
    """The former loop: per physical batch, every statistic read to the host with float()."""
    grpo = config.algorithm.grpo
    total = sum(s.response_len for s in sequences)
    loss_sum = kl_sum = entropy_sum = clipped = drift_sum = 0.0
    for index_list in physical_batches(runtime, sequences, config.train.trajectory_batch_size):
        part = [sequences[i] for i in index_list]
        rows, targets = rows_of(part, teacher=False), targets_of(part, CPU)
        with runtime.use("reference") as ref, torch.no_grad():
            part_ref, _ = chunked_token_logprobs(
                ref.selected_hidden(rows, trajectory_batch_size=len(part)), ref.head_weight, targets, chunk_size=7
            )
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows, trajectory_batch_size=len(part))
            logp, entropy = chunked_token_logprobs(
                hidden, student.head_weight, targets, chunk_size=7, with_entropy=True
            )
        assert entropy is not None
        entropy_sum += float(entropy.detach().sum())
        part_old = torch.cat([old_logp[i] for i in index_list]).to(logp.dtype)
        adv = torch.tensor([s.advantage for s in part for _ in range(s.response_len)], dtype=logp.dtype)
        ones = torch.ones_like(logp, dtype=torch.bool)[None]
        args = (logp[None], part_old[None], adv[None], ones)
        token_losses = ppo_clip_token_losses(*args, clip_low=grpo.clip_low, clip_high=grpo.clip_high)[0]
        frac = clip_fraction(logp.detach()[None], *args[1:], clip_low=grpo.clip_low, clip_high=grpo.clip_high)
        clipped += logp.shape[0] * float(frac)
        drift_sum += float((part_old - logp.detach()).sum())
        kl_tokens = kl_penalty(logp, part_ref, grpo.kl_estimator)
        loss = token_losses.sum() / total + grpo.kl_coef * kl_tokens.sum() / total
        kl_sum += float(kl_tokens.detach().sum())
        loss.backward()
        loss_sum += float(loss.detach())
    return UpdateStats(
        loss=loss_sum,
        kl=kl_sum / total,
        tokens=total,
        entropy=entropy_sum / total,
        clip_fraction=clipped / total,
        ppo_kl=drift_sum / total,
    )


@pytest.mark.parametrize("batch", [1, 2, "auto"])
def test_statistics_and_gradients_equal_the_per_batch_host_loop(batch: int | str) -> None:
    runtime = _runtime()
    sequences = _sequences()
    grpo = GrpoSection(kl_coef=0.1, kl_mode="loss", clip_low=0.1, clip_high=0.1)
    config = SimpleNamespace(
        algorithm=SimpleNamespace(grpo=grpo), train=SimpleNamespace(logprob_chunk_size=7, trajectory_batch_size=batch)
    )
    # old log-probs a little off the current ones: ratios away from 1, some clipped
    gen = torch.Generator().manual_seed(11)
    old = [torch.randn(s.response_len, generator=gen) * 0.3 - 2.0 for s in sequences]
    params = runtime.trainable_parameters()
    expected = _reference_update(runtime, sequences, config, old)
    expected_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    got = grpo_update(runtime, sequences, config, old_logp=old)  # type: ignore[arg-type]
    assert got == expected
    assert got.clip_fraction is not None and 0 < got.clip_fraction < 1
    for p, g in zip(params, expected_grads, strict=True):
        assert p.grad is not None and torch.equal(p.grad, g)
