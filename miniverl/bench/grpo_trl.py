"""The ``trl`` cell of ``miniverl bench grpo``: TRL's ``GRPOTrainer`` on the same shape, prompts and lengths.

Only imported when ``trl`` is importable. The model is the bench's seeded random model (sdpa, the
bench dtype) with a LoRA r16 ``peft_config`` on the same layers; the tokenizer is a word-level
tokenizer whose tokens are the ids themselves, so a prompt ``"17 4 99"`` encodes to ``[17, 4, 99]``
as in the miniverl cells. Lengths are fixed with ``generation_kwargs={"min_new_tokens": n}`` and
``max_completion_length = n``. One TRL step generates ``prompts x samples`` completions and makes
one optimizer update (``per_device_train_batch_size = prompts x samples``, ``num_generations =
samples``, ``beta = 0``: no reference model, like the miniverl cells). Everything else is TRL's
default (including ``gradient_checkpointing``, recorded in the cell). A callback times each
optimizer step (CUDA-synchronized); the first ``warmup`` steps are not timed.
"""

from __future__ import annotations

import contextlib
import io
import random
import statistics
import tempfile
import time
from typing import Any

import torch

from miniverl.bench.common import random_prompt_ids, spread
from miniverl.gate.models import LORA_TARGETS

GIB = float(1 << 30)


PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"
SPECIAL_IDS = {PAD: 0, UNK: 1, EOS: 2}


def id_tokenizer(vocab: int) -> Any:
    """A fast tokenizer mapping the text ``"i j k"`` to ids ``[i, j, k]`` (pad ``0``, unk ``1``, EOS ``2``).

    The special tokens are words that no number contains: transformers matches special tokens inside the raw text
    before splitting it, so special tokens spelled "0", "1", "2" split "102" into three ids.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {str(i): i for i in range(vocab) if i not in SPECIAL_IDS.values()} | SPECIAL_IDS
    core = Tokenizer(models.WordLevel(words, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK)
    tok.padding_side = "left"
    return tok


def encode_equal_work(tokenizer: Any, prompt_ids: list[list[int]]) -> list[str]:
    """The prompts as texts that ``tokenizer`` encodes back to exactly ``prompt_ids``: TRL then sees the same token
    ids, and the same lengths, as the miniverl cells (refused otherwise: the comparison would be of unequal work)."""
    texts = [" ".join(map(str, ids)) for ids in prompt_ids]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    for ids, got in zip(prompt_ids, encoded, strict=True):
        if list(got) != list(ids):
            raise RuntimeError(f"unequal work: the TRL tokenizer encodes prompt {ids[:8]}... as {list(got)[:8]}...")
    return texts


def trl_liger_options(config_class: Any) -> dict[str, bool]:
    """TRL's liger-kernel switch: ``use_liger_loss`` (its fused GRPO loss, TRL < 1.0) where ``GRPOConfig`` has it;
    TRL 1.x removed it (its chunked LM head is always on) and keeps transformers' ``use_liger_kernel`` (liger's
    layer kernels)."""
    fields = set(getattr(config_class, "__dataclass_fields__", {}))
    for name in ("use_liger_loss", "use_liger_kernel"):
        if name in fields:
            return {name: True}
    raise ValueError(f"{config_class.__name__} has neither use_liger_loss nor use_liger_kernel")


def run_trl_cell(
    loader: Any, opts: Any, device: torch.device, dtype_name: str, *, liger: bool = False
) -> dict[str, Any]:
    import datasets
    import peft
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    liger_options = trl_liger_options(GRPOConfig) if liger else {}
    vocab = int(loader.config.vocab_size)
    steps = opts.warmup + opts.repeats
    tokenizer = id_tokenizer(vocab)
    prompts = encode_equal_work(tokenizer, random_prompt_ids(opts.prompts, opts.prompt_tokens, vocab, opts.seed))
    dataset = datasets.Dataset.from_dict({"prompt": prompts * steps})
    rng = random.Random(opts.seed)

    def reward(completions: list[Any], **_: Any) -> list[float]:
        return [rng.random() for _ in completions]

    timings: list[float] = []
    lengths: list[float] = []
    peak: dict[str, float] = {}

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.start = 0.0
            self.step = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.step == opts.warmup and device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            timings.append(time.perf_counter() - self.start)
            self.step += 1
            if device.type == "cuda":
                peak["reserved"] = torch.cuda.max_memory_reserved(device) / GIB

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            for key in ("completions/mean_length", "completion_length"):
                if logs and key in logs:
                    lengths.append(float(logs[key]))

    model = loader.model(device, getattr(torch, dtype_name))
    with tempfile.TemporaryDirectory(prefix="miniverl-trl-") as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=opts.prompts * opts.samples, num_generations=opts.samples,
            max_completion_length=opts.new_tokens, generation_kwargs={"min_new_tokens": opts.new_tokens},
            temperature=1.0, learning_rate=opts.learning_rate, max_steps=steps, logging_steps=1, report_to="none",
            save_strategy="no", disable_tqdm=True, bf16=dtype_name == "bfloat16", use_cpu=device.type == "cpu",
            seed=opts.seed, shuffle_dataset=False, dataloader_num_workers=0, **liger_options,
        )  # fmt: skip
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS),
            callbacks=[Timer()],
        )
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its log dicts: keep stdout clean
            trainer.train()
        checkpointing = bool(config.gradient_checkpointing)
    del trainer, model
    timed = timings[opts.warmup :]
    if len(timed) != opts.repeats:
        raise RuntimeError(f"TRL ran {len(timings)} steps, expected {steps}")
    if lengths and any(abs(x - opts.new_tokens) > 1e-6 for x in lengths):
        raise RuntimeError(f"fixed lengths broken: TRL logged mean completion lengths {lengths}")
    return {
        "status": "measured",
        "first_call_seconds": timings[0] if opts.warmup else None,
        "step_seconds": timed,
        "median_step_seconds": statistics.median(timed),
        "spread_step_seconds": spread(timed),
        "peak_reserved_gib": peak.get("reserved"),
        "logged_mean_completion_lengths": lengths,
        "gradient_checkpointing": checkpointing,
        "liger_options": liger_options,
    }
