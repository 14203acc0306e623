"""Tiny, hermetic models and tokenizer for tests: no downloads, built in well under a second.

- :func:`make_tiny_tokenizer` trains a byte-level BPE (vocab 400) in memory on a fixed corpus of
  arithmetic word problems and chat text, and wraps it in ``PreTrainedTokenizerFast`` with
  ``<unk>``/``<pad>``/``<s>``/``<|im_start|>``/``<|im_end|>`` (ids 0-4; eos is ``<|im_end|>``) and a
  ChatML-style chat template. Any text round-trips (byte-level), and the vocabulary is deterministic.
- :func:`make_tiny_llama` / :func:`make_tiny_qwen3`: random-init float32 causal LMs (hidden 64,
  2 layers, 4 heads, 2 KV heads, intermediate 128, tied embeddings, eager attention).
- :func:`save_tiny_model_dir`: a local safetensors model directory (usable as ``source: local``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

UNK, PAD, BOS, IM_START, IM_END = "<unk>", "<pad>", "<s>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [UNK, PAD, BOS, IM_START, IM_END]
TINY_VOCAB_SIZE = 400

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_NAMES = ["Mia", "Sam", "Ava", "Leo", "Zoe", "Max", "Ivy", "Ben"]
_ITEMS = ["apples", "pencils", "marbles", "cookies", "stickers", "books", "coins", "shells"]
_SENTENCES = [
    "{n} has {a} {i} and buys {b} more. How many {i} does {n} have now?",
    "{n} has {a} {i} and gives {b} to a friend. How many {i} are left?",
    "{n} buys {a} bags with {b} {i} in each bag. How many {i} in total?",
    "Worked answer: {a} + {b} = {c}. The answer is {c}.",
    "Worked answer: {a} * {b} = {c}, {c} - {a} = {b}. The answer is {b}.",
    "The answer is {c}. Reply with the final number.",
    "Write one short sentence about the sea, the sky, a cat or a tree.",
    "Sure! Here is a short answer: it is {c}.",
]


def _corpus() -> list[str]:
    lines = []
    for k, template in enumerate(_SENTENCES):
        for j in range(12):
            a, b = (3 * j + k) % 10 + 2, (5 * j + 2 * k) % 9 + 2
            lines.append(template.format(n=_NAMES[j % len(_NAMES)], i=_ITEMS[(j + k) % len(_ITEMS)], a=a, b=b, c=a + b))
    lines.append("0 1 2 3 4 5 6 7 8 9 10 11 12 100 , . ! ? : ; ( ) + - * = \\boxed{12}")
    return lines


@functools.lru_cache(maxsize=1)
def _trained_tokenizer_json() -> str:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok.to_str()


def make_tiny_tokenizer(*, with_pad_token: bool = True, chat_template: bool = True) -> PreTrainedTokenizerFast:
    """A fresh tokenizer each call (tests may mutate it); the BPE training itself is cached.

    ``with_pad_token=False`` mimics tokenizers that ship no pad token (SmolLM2's GGUF tokenizer);
    ``chat_template=False`` gives one without a chat template.
    """
    special: dict[str, Any] = {"unk_token": UNK, "bos_token": BOS, "eos_token": IM_END}
    if with_pad_token:
        special["pad_token"] = PAD
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_tokenizer_json()),
        chat_template=CHAT_TEMPLATE if chat_template else None,
        **special,
    )
    return tokenizer


def _common_config(tokenizer: PreTrainedTokenizerFast) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _build(model_cls: type[PreTrainedModel], config: Any, seed: int) -> Any:
    # fork_rng: building a model must not disturb the caller's global torch RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = model_cls(config)
    model.to(torch.float32)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.eval()
    return model


def make_tiny_llama(tokenizer: PreTrainedTokenizerFast, seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    """Random-init float32 ``LlamaForCausalLM``; ``overrides`` replace any config field."""
    config = LlamaConfig(**{**_common_config(tokenizer), **overrides})
    config._attn_implementation = "eager"
    model: LlamaForCausalLM = _build(LlamaForCausalLM, config, seed)
    return model


def make_tiny_qwen3(tokenizer: PreTrainedTokenizerFast, seed: int = 0, **overrides: Any) -> Qwen3ForCausalLM:
    """Random-init float32 ``Qwen3ForCausalLM``; ``overrides`` replace any config field."""
    config = Qwen3Config(**{**_common_config(tokenizer), **overrides})
    config._attn_implementation = "eager"
    model: Qwen3ForCausalLM = _build(Qwen3ForCausalLM, config, seed)
    return model


def save_tiny_model_dir(path: str | Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> Path:
    """Write a local model directory (config, generation config, safetensors weights, tokenizer)."""
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
