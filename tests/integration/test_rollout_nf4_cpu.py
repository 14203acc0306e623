"""The fast engine folds an NF4 base + LoRA policy: greedy tokens equal the HF path (CPU, fp32 compute)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from miniverl.config.schema import LoraConfig, ModelSpec
from miniverl.errors import DependencyError
from miniverl.models.loading import attach_lora, import_bitsandbytes, load_causal_lm
from miniverl.models.sources import resolve
from miniverl.rollout.hf import PromptInput, generate_group
from miniverl.rollout.weights import effective_weight

try:
    bnb = import_bitsandbytes()
except DependencyError:
    pytest.skip("bitsandbytes is not installed", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [PromptInput("a", "Mia has 7 apples."), PromptInput("b", "Write one short sentence about the sea.")]


def test_nf4_lora_policy_folds_to_the_same_greedy_tokens(tiny_model_dir: Path) -> None:
    resolved = resolve(ModelSpec(source="local", path=str(tiny_model_dir)))
    model, tokenizer = load_causal_lm(resolved, dtype="float32", device="cpu", quantization="nf4")
    actor = attach_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=TARGETS))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    layer = actor.get_base_model().model.layers[0].self_attn.q_proj
    assert isinstance(layer.base_layer, bnb.nn.Linear4bit)
    x = torch.randn(3, layer.in_features, generator=gen)
    with torch.no_grad():  # the folded weight reproduces the NF4 + LoRA layer's output
        assert torch.allclose(layer(x), x @ effective_weight(layer).T, atol=1e-4)
    kw = {"samples_per_prompt": 1, "max_new_tokens": 12, "temperature": 0.0}
    fast = generate_group(actor, tokenizer, PROMPTS, engine="fast", **kw)
    hf = generate_group(actor, tokenizer, PROMPTS, engine="hf", **kw)
    assert [t.response_token_ids for t in fast] == [t.response_token_ids for t in hf]
