"""NF4 + LoRA gradients on CPU are right, even after an eval/no-grad forward (the repack hazard).

bitsandbytes 0.50.2 repacks a ``Linear4bit`` weight into an AVX512-BF16 layout on the first
eval/no-grad CPU forward; that layout has no autograd, so later LoRA gradients are silently wrong.
The reference is an fp32 model holding exactly the dequantized NF4 weights and the same LoRA
values: its gradients must match. Without the fix (on a CPU with AVX512-BF16) they must not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miniverl.config.schema import LoraConfig, ModelSpec
from miniverl.errors import DependencyError
from miniverl.models.loading import (
    attach_lora,
    disable_cpu_weight_repack,
    import_bitsandbytes,
    load_causal_lm,
)
from miniverl.models.sources import resolve

try:
    bnb = import_bitsandbytes()
except DependencyError:
    pytest.skip("bitsandbytes is not installed", allow_module_level=True)

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=TARGETS)


def linear4bit_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def is_repacked(model: torch.nn.Module) -> bool:
    return any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in linear4bit_modules(model))


def build_pair(model_dir: Path) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(NF4 LoRA model, fp32 LoRA model with the same dequantized weights and the same LoRA values)."""
    resolved = resolve(ModelSpec(source="local", path=str(model_dir)))
    quantized, _ = load_causal_lm(resolved, dtype="float32", device="cpu", quantization="nf4")
    reference, _ = load_causal_lm(resolved, dtype="float32", device="cpu")
    modules = dict(quantized.named_modules())
    replaced = 0
    with torch.no_grad():
        for name, module in reference.named_modules():
            q = modules.get(name)
            if isinstance(module, torch.nn.Linear) and isinstance(q, bnb.nn.Linear4bit):
                dequantized = bnb.functional.dequantize_4bit(q.weight.data, q.weight.quant_state)
                module.weight.copy_(dequantized.to(torch.float32))
                replaced += 1
    assert replaced == 2 * 7  # every targeted projection is 4-bit; lm_head/embeddings stay float
    quantized_lora, reference_lora = attach_lora(quantized, LORA), attach_lora(reference, LORA)
    generator = torch.Generator().manual_seed(1)
    reference_params = dict(reference_lora.named_parameters())
    with torch.no_grad():
        for name, param in quantized_lora.named_parameters():
            if param.requires_grad:  # nonzero B as well, so every LoRA tensor gets a gradient
                value = torch.randn(param.shape, generator=generator) * 0.1
                param.copy_(value)
                reference_params[name].copy_(value)
    return quantized_lora, reference_lora


def lora_grads(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    model.train()
    model.zero_grad(set_to_none=True)
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    grads = [p.grad.flatten() for _, p in sorted(model.named_parameters()) if p.requires_grad]
    return torch.cat(grads)


def eval_forward(model: torch.nn.Module, input_ids: torch.Tensor) -> None:
    model.eval()
    with torch.no_grad():
        model(input_ids=input_ids)


def compare(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    cosine = torch.nn.functional.cosine_similarity(got, want, dim=0).item()
    relative = ((got - want).norm() / want.norm()).item()
    return cosine, relative


@pytest.fixture()
def input_ids() -> torch.Tensor:
    return torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(2))


def test_nf4_lora_gradients_match_fp32_after_an_eval_forward(tiny_model_dir: Path, input_ids: torch.Tensor) -> None:
    quantized, reference = build_pair(tiny_model_dir)
    assert all(m.support_avx512bf16_for_cpu is False for m in linear4bit_modules(quantized))
    eval_forward(quantized, input_ids)  # the forward that would trigger the repack
    assert not is_repacked(quantized)
    cosine, relative = compare(lora_grads(quantized, input_ids), lora_grads(reference, input_ids))
    assert cosine > 0.999 and relative < 1e-3, (cosine, relative)


@pytest.mark.skipif(
    not bnb.functional.has_avx512bf16(), reason="this CPU has no AVX512-BF16: the repack path never runs"
)
def test_without_the_fix_gradients_are_wrong_and_the_fix_repairs_a_repacked_model(
    tiny_model_dir: Path, input_ids: torch.Tensor
) -> None:
    quantized, reference = build_pair(tiny_model_dir)
    want = lora_grads(reference, input_ids)
    for module in linear4bit_modules(quantized):
        module.support_avx512bf16_for_cpu = True  # undo the fix: bitsandbytes' default on this CPU
    eval_forward(quantized, input_ids)
    assert is_repacked(quantized)
    cosine, _ = compare(lora_grads(quantized, input_ids), want)
    assert cosine < 0.99, f"expected the known-wrong gradient, got cosine {cosine}"

    assert disable_cpu_weight_repack(quantized) == 2 * 7  # also converts repacked weights back
    assert not is_repacked(quantized)
    eval_forward(quantized, input_ids)
    cosine, relative = compare(lora_grads(quantized, input_ids), want)
    # The repack rounded the block scales (absmax) to bf16 and the inverse re-quantizes them, so the
    # weights are only close to the reference now: right direction, ~0.2% off. Hence load_causal_lm
    # turns the repack off before any forward rather than undoing it afterwards.
    assert cosine > 0.999 and relative < 1e-2, (cosine, relative)


def weight_bytes(params: list[torch.nn.Parameter]) -> int:
    """Their storage on the device, and each 4-bit weight's block scales (bitsandbytes' double quantization: an 8-bit
    absmax per 64 weights, and their own fp32 absmax, offset and code tables)."""
    total = 0
    for param in params:
        total += param.data.nbytes
        state = getattr(param, "quant_state", None)
        if state is not None:
            total += state.absmax.nbytes + state.code.nbytes
            if state.nested:
                total += state.state2.absmax.nbytes + state.state2.code.nbytes + state.offset.nbytes
    return total


def test_the_memory_plan_counts_an_nf4_models_weights_as_bitsandbytes_loads_them(tmp_path: Path) -> None:
    """The memory plan's and the plan's placement base weights for an NF4 student are the loaded bytes: the decoder's
    linears in 4 bits with their double-quantized scales, the embeddings (a large vocabulary here, as Qwen3's 151,936
    rows) and the norms in the model's dtype."""
    from miniverl.config.plan import estimated_weight_bytes
    from miniverl.models.sources import describe_architecture
    from miniverl.runtime.memory_shapes import NF4_BYTES_PER_PARAM, DecoderDims
    from tests.helpers.tiny import make_tiny_qwen3, make_tiny_tokenizer, save_tiny_model_dir

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_qwen3(tokenizer, hidden_size=256, intermediate_size=768, head_dim=64, vocab_size=8192)
    directory = save_tiny_model_dir(tmp_path / "model", model, tokenizer)
    loaded, _ = load_causal_lm(resolve(ModelSpec(source="local", path=str(directory))), dtype="float32", device="cpu",
                               quantization="nf4")  # fmt: skip
    dims = DecoderDims.from_hf_config(loaded.config)
    four_bit = [module.weight for module in linear4bit_modules(loaded)]
    assert len(four_bit) == 2 * 7
    # the per-module code tables (~1 KiB each) are ~2 % of these small linears, nothing at Qwen3-0.6B's
    assert dims.linear_params() * NF4_BYTES_PER_PARAM == pytest.approx(weight_bytes(four_bit), rel=0.03)
    measured = weight_bytes(list(loaded.parameters()))
    assert dims.base_weight_bytes(4.0, quantized=True) == pytest.approx(measured, rel=0.01)
    arch = describe_architecture(resolve(ModelSpec(source="local", path=str(directory))))
    assert estimated_weight_bytes(arch, "float32", quantized=True, physical=1) == pytest.approx(measured, rel=0.01)
    assert dims.base_params() * NF4_BYTES_PER_PARAM < 0.5 * measured  # every parameter in 4 bits: the plan before
