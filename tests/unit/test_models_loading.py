"""Loading tiny local models: frozen/eval, left padding, pad token, LoRA-only training, frozen adapters."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from miniverl.config.schema import AdapterSpec, LoraConfig, ModelSpec
from miniverl.errors import ConfigError, ModelSourceError
from miniverl.models import loading
from miniverl.models.loading import attach_lora, count_parameters, load_causal_lm, load_frozen_adapter
from miniverl.models.sources import describe_architecture, resolve
from tests.helpers.tiny import make_tiny_llama, make_tiny_qwen3, make_tiny_tokenizer, save_tiny_model_dir

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_local(path: Path, **kwargs: str) -> tuple[torch.nn.Module, object]:
    resolved = resolve(ModelSpec(source="local", path=str(path)))
    return load_causal_lm(resolved, device="cpu", **kwargs)


def expected_lora_params(model: torch.nn.Module, rank: int) -> int:
    total = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
            total += rank * (module.in_features + module.out_features)
    return total


def test_loaded_model_is_frozen_in_eval_with_left_padding(tiny_model_dir: Path) -> None:
    model, tokenizer = load_local(tiny_model_dir)
    assert not model.training
    assert count_parameters(model)[0] == 0
    assert tokenizer.padding_side == "left"
    assert tokenizer.pad_token is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    batch = tokenizer(["1 2", "The answer is 12."], return_tensors="pt", padding=True)
    assert batch["attention_mask"][0, 0] == 0 and batch["attention_mask"][0, -1] == 1


def test_tokenizer_without_pad_gets_eos_as_pad(tmp_path: Path) -> None:
    tokenizer = make_tiny_tokenizer(with_pad_token=False)
    directory = save_tiny_model_dir(tmp_path / "nopad", make_tiny_llama(tokenizer), tokenizer)
    model, loaded = load_local(directory)
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"
    assert model.config.pad_token_id == loaded.eos_token_id


@pytest.mark.parametrize("maker", [make_tiny_llama, make_tiny_qwen3])
def test_architecture_param_count_is_exact(maker: object, tmp_path: Path) -> None:
    tokenizer = make_tiny_tokenizer()
    model = maker(tokenizer)  # type: ignore[operator]
    directory = save_tiny_model_dir(tmp_path / "m", model, tokenizer)
    arch = describe_architecture(resolve(ModelSpec(source="local", path=str(directory)), fetch=False))
    assert arch["param_count"] == sum(p.numel() for p in model.parameters())
    assert arch["tie_word_embeddings"] is True and arch["num_key_value_heads"] == 2


def test_lora_trains_only_adapter_parameters(tiny_model_dir: Path) -> None:
    model, tokenizer = load_local(tiny_model_dir)
    total_before = count_parameters(model)[1]
    expected = expected_lora_params(model, 4)
    assert expected == 2 * 4 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 128))  # 2 layers, 7 targets
    peft_model = attach_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0, target_modules=TARGETS))
    trainable, total = count_parameters(peft_model)
    assert trainable == expected
    assert total == total_before + trainable
    names = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert names and all(".lora_A.default." in n or ".lora_B.default." in n for n in names)

    peft_model.train()
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    batch = tokenizer(["The answer is 12.", "Mia has 3 apples"], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    for _ in range(2):  # B starts at zero, so A only moves from the second step on
        optimizer.zero_grad()
        peft_model(**batch, labels=labels).loss.backward()
        optimizer.step()
    for name, param in peft_model.named_parameters():
        changed = not torch.equal(before[name], param.detach())
        assert changed == param.requires_grad, name


def test_lora_partial_targets_and_bad_targets(tiny_model_dir: Path) -> None:
    model, _ = load_local(tiny_model_dir)
    peft_model = attach_lora(model, LoraConfig(r=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    hidden, kv_out = 64, 2 * 16
    assert count_parameters(peft_model)[0] == 2 * (2 * (hidden + 64) + 2 * (hidden + kv_out))
    other, _ = load_local(tiny_model_dir)
    with pytest.raises(ConfigError, match="do not fit this model"):
        attach_lora(other, LoraConfig(target_modules=["no_such_proj"]))
    with pytest.raises(ConfigError, match="full fine-tuning is not supported"):
        attach_lora(other, LoraConfig(enabled=False))


def _saved_adapter(tiny_model_dir: Path, out: Path) -> Path:
    model, _ = load_local(tiny_model_dir)
    peft_model = attach_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(out)
    return out


def test_frozen_adapter_loads_pinned_and_refuses_a_mismatch(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter_dir = _saved_adapter(tiny_model_dir, tmp_path / "adapter")
    digest = hashlib.sha256((adapter_dir / "adapter_model.safetensors").read_bytes()).hexdigest()
    inputs = torch.tensor([[5, 6, 7, 8]])

    base, _ = load_local(tiny_model_dir)
    with torch.no_grad():
        base_logits = base(input_ids=inputs).logits
    teacher = load_frozen_adapter(base, AdapterSpec(source="local", path=str(adapter_dir), sha256=digest), "teacher")
    assert count_parameters(teacher)[0] == 0 and not teacher.training
    with torch.no_grad():
        assert not torch.allclose(teacher(input_ids=inputs).logits, base_logits)

    fresh, _ = load_local(tiny_model_dir)
    with pytest.raises(ModelSourceError, match=r"adapter_model\.safetensors has sha256"):
        load_frozen_adapter(fresh, AdapterSpec(source="local", path=str(adapter_dir), sha256="0" * 64), "teacher")
    with pytest.raises(ModelSourceError, match="adapter directory not found"):
        load_frozen_adapter(fresh, AdapterSpec(source="local", path=str(tmp_path / "absent")), "teacher")


def test_frozen_adapter_beside_a_trainable_actor(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter_dir = _saved_adapter(tiny_model_dir, tmp_path / "adapter")
    model, _ = load_local(tiny_model_dir)
    actor = attach_lora(model, LoraConfig(r=4, alpha=8, target_modules=TARGETS))
    trainable_before = count_parameters(actor)[0]
    same = load_frozen_adapter(actor, AdapterSpec(source="local", path=str(adapter_dir)), "teacher")
    assert same is actor and actor.active_adapter == "default"
    assert count_parameters(actor)[0] == trainable_before
    assert all("teacher" not in n for n, p in actor.named_parameters() if p.requires_grad)


def test_unfetched_model_cannot_be_loaded_and_bf16_on_cpu_warns_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unfetched = resolve(ModelSpec(source="builtin", model_id="smollm2-135m-instruct"), fetch=False)
    with pytest.raises(ModelSourceError, match="resolve with fetch=True"):
        load_causal_lm(unfetched)
    monkeypatch.setattr(loading, "_warned", set())
    with pytest.warns(UserWarning, match="bfloat16 on CPU"):
        model, _ = load_local(tiny_model_dir, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_local(tiny_model_dir, dtype="bfloat16")
    assert loading.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
