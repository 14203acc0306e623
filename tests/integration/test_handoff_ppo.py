"""PPO hand-off (compiler v2) end to end on a tiny model, no verl needed: the example trains here, and
the bundle's critic adapter is miniverl's critic in the form verl trains (TOKEN_CLS, value head as score)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_handoff import _no_local_paths

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ppo-verl-smollm2.yaml"


def example_on_tiny(model_dir: Path) -> dict[str, Any]:
    """examples/ppo-verl-smollm2.yaml with the tiny local model and a CPU-sized budget (all else as written)."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["models"]["device"] = "cpu"
    config["models"]["student"] = {
        "source": "local",
        "path": str(model_dir),
        "lora": config["models"]["student"]["lora"],
    }
    config["rollout"] = {**config["rollout"], "max_new_tokens": 6}
    config["train"] = {**config["train"], "cycles": 1, "trajectory_batch_size": 2}
    return config


def _values_token_cls(model_dir: Path, adapter: Path, ids: list[int]) -> tuple[Any, list[str]]:
    """The critic as verl builds it: TokenClassification (num_labels 1) + PeftModel.from_pretrained(adapter)."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(str(model_dir))
    config.num_labels, config.classifier_dropout = 1, 0.0  # as verl's critic
    base = AutoModelForTokenClassification.from_pretrained(str(model_dir), config=config, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(adapter), is_trainable=True)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    with torch.no_grad():
        values = model(input_ids=torch.tensor([ids])).logits[0, :, 0]
    return values, trainable


def _values_miniverl(model_dir: Path, critic_dir: Path, ids: list[int]) -> Any:
    """miniverl's exported critic: its PEFT adapter on the causal LM, value_head on the last hidden state."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(model_dir)), str(critic_dir))
    head = load_file(str(critic_dir / "value_head.safetensors"))
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    return hidden @ head["weight"][0] + head["bias"][0]


def test_ppo_example_trains_here_and_hands_off_its_critic_exactly(
    cli, write_config, tiny_model_dir, prompts, workdir: Path
) -> None:
    import torch
    from safetensors.torch import load_file

    from miniverl.handoff.critic_adapter import SCORE_KEYS, seeded_value_head

    write_config(example_on_tiny(tiny_model_dir))
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    planned = cli("handoff", "plan.json", "--out", "from-plan", "--json")
    assert planned.code == 0, planned.err
    assert planned.json()["compiler"] == "verl-rl-v0.9-single-gpu-v2"
    fresh = workdir / "from-plan"
    manifest = json.loads((fresh / "manifest.json").read_text())
    assert manifest["config_name"] == "miniverl_ppo"
    assert manifest["critic_adapter"]["start"] == "seeded_head" and manifest["critic_adapter"]["lora_tensors"] == 0
    config = json.loads((fresh / "critic_adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "TOKEN_CLS" and config["modules_to_save"] == ["score"]
    head = load_file(str(fresh / "critic_adapter" / "adapter_model.safetensors"))
    seeded = seeded_value_head(manifest["critic_adapter"]["hidden_size"], seed=0)
    assert torch.equal(head[SCORE_KEYS[0]], seeded["weight"]) and torch.equal(head[SCORE_KEYS[1]], seeded["bias"])
    verl = yaml.safe_load((fresh / "config" / "miniverl_ppo.yaml").read_text())
    assert verl["critic"]["model"]["lora_adapter_path"] == "critic_adapter"
    assert verl["reward_model"] == {"enable": False} and verl["algorithm"]["adv_estimator"] == "gae"
    _, trainable = _values_token_cls(fresh / "model", fresh / "critic_adapter", [1, 2, 3])
    assert any("score" in n for n in trainable) and any("lora_A" in n for n in trainable)

    trained = cli("run", "--plan", "plan.json", "--run-id", "p", "--json")  # the example trains here (1 cycle)
    assert trained.code == 0, trained.err
    assert trained.json()["summary"]["algorithm"] == "ppo"
    result = cli("handoff", "runs/p", "--out", "from-run", "--json")
    assert result.code == 0, result.err
    bundle = workdir / "from-run"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["critic_adapter"]["start"] == "run_checkpoint" and manifest["critic_adapter"]["lora_tensors"] > 0
    assert cli("export", "runs/p", "--out", "exported").code == 0
    ids = [3, 7, 11, 2, 5, 9]
    verl_values, trainable = _values_token_cls(bundle / "model", bundle / "critic_adapter", ids)
    ours = _values_miniverl(tiny_model_dir, workdir / "exported" / "critic", ids)
    assert any("score" in n for n in trainable)
    assert float((verl_values - ours).abs().max()) < 1e-5  # the same critic, value head included
    for root in (fresh, bundle):
        _no_local_paths(root, workdir, tiny_model_dir)
