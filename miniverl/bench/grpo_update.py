"""The update benchmark of ``miniverl bench grpo``: one optimizer update on B rows of T tokens, HF + PEFT as a
first implementation writes it against miniverl's :func:`grpo_update` (fp32 adapter, or bf16 with fp32 masters, and
that with fused training kernels: ours or liger-kernel's, :mod:`miniverl.runtime.fused`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from miniverl.bench.common import random_prompt_ids
from miniverl.bench.grpo_args import GrpoBenchOptions
from miniverl.bench.grpo_models import AdapterTrainer, RandomLoader, role_runtime, sync, update_sequences
from miniverl.gate.models import LORA_TARGETS
from miniverl.runtime.fused import FusedKernels


def fused_kind(path: str) -> FusedKernels | None:
    """The fused training kernels an update path runs with (``None``: HF's modules as loaded)."""
    if path.endswith("_fused"):
        return "triton"
    return "liger" if path.endswith("_liger") else None


def compile_decoder_layers(model: Any) -> int:
    """Each decoder layer of ``model`` through ``torch.compile`` (inductor fuses its element-wise work: the norms,
    RoPE, SiLU, PEFT's LoRA scale-and-add, the casts); how many. A probe of what compiling would buy, not a
    training option yet: the layers compile on their first call (inside the bench's warm-up)."""
    from miniverl.runtime.loading import decoder_of

    layers = list(decoder_of(model).layers)
    for layer in layers:
        layer.compile()
    return len(layers)


def update_runner(path: str, loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str
                   ) -> tuple[Callable[[int], dict[str, float]], Any]:  # fmt: skip
    """``run(step) -> {"update_seconds"}``: one optimizer update on B rows of T tokens."""
    batch, length = opts.update_shape
    vocab = int(loader.config.vocab_size)
    prompt = min(32, length // 4)
    ids = random_prompt_ids(batch, length, vocab, opts.seed + 1)
    gen = torch.Generator().manual_seed(opts.seed + 2)
    advantages = (torch.rand(batch, generator=gen) * 2 - 1).tolist()
    if path == "naive_hf_peft":
        import peft

        model = loader.model(device, getattr(torch, dtype_name))
        model = peft.get_peft_model(
            model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
        )
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=opts.learning_rate, weight_decay=0.0)
        input_ids = torch.tensor(ids, device=device)
        adv = torch.tensor(advantages, device=device, dtype=torch.float32)
        mask = torch.zeros(batch, length - 1, device=device)
        mask[:, prompt - 1 :] = 1.0

        def naive(step: int) -> dict[str, float]:
            sync(device)
            start = time.perf_counter()
            logits = model(input_ids=input_ids).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
            loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync(device)
            return {"update_seconds": time.perf_counter() - start}

        return naive, model
    from miniverl.training.algorithms.grpo import grpo_update

    runtime = role_runtime(loader, device, dtype_name, train_batch=batch, checkpointing=opts.activation_checkpointing)
    kind = fused_kind(path)
    if kind is not None:
        runtime.fuse_training_kernels(kind)
    if path.endswith("_compiled"):
        compile_decoder_layers(runtime._student_model())
    trainer = AdapterTrainer(runtime, opts.learning_rate, bf16_master=path.startswith("miniverl_update_bf16"))
    sequences = update_sequences([(row[:prompt], row[prompt:]) for row in ids], advantages)

    def ours(step: int) -> dict[str, float]:
        sync(device)
        start = time.perf_counter()
        grpo_update(runtime, sequences, runtime.bench_config)
        trainer.step()
        sync(device)
        return {"update_seconds": time.perf_counter() - start}

    return ours, runtime
