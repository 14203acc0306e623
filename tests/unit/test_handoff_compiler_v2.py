"""Compiler v2 (PPO with a critic): the rules table, the refusals, the IR and its verl config (golden digests)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from miniverl.config.loader import validate_config
from miniverl.config.schema import MiniverlConfig
from miniverl.handoff.compiler import compile_plan_ir
from miniverl.handoff.compiler_v2 import ppo_ir
from miniverl.handoff.emit import emit_verl_config
from miniverl.handoff.ir import COMPILER_V2, PpoIR, ir_digest
from miniverl.handoff.rules import HandoffRefusal, load_rules, render_markdown, rules_digest
from miniverl.schemas import schema_texts
from tests.unit.test_handoff_compiler import HUB_REVISION, ROOT, _leaves, _plan, _sha

GOLDEN = ROOT / "tests" / "golden" / "handoff-v2.json"


def _ppo(**changes: Any) -> MiniverlConfig:
    data: dict[str, Any] = {
        "run": {"name": "golden-ppo", "seed": 5},
        "models": {
            "dtype": "bfloat16",
            "student": {
                "source": "hub",
                "model_id": "Qwen/Qwen3-0.6B",
                "revision": HUB_REVISION,
                "lora": {"r": 16, "alpha": 32},
            },
            "critic": {"source": "student"},
        },
        "data": {"path": "prompts.parquet"},
        "rollout": {"prompts_per_cycle": 4, "samples_per_prompt": 2, "max_new_tokens": 32},
        "algorithm": {
            "name": "ppo",
            "ppo": {"gamma": 0.99, "lam": 0.9, "ppo_epochs": 2, "mini_batches": 2, "critic_learning_rate": 3e-5},
            "rewards": [{"name": "calculator_exact", "weight": 1.0}],
        },
        "train": {"cycles": 3, "learning_rate": 1e-5, "trajectory_batch_size": 2},
    }
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate_config(data, origin="test")


def test_v2_rules_cover_every_config_field_and_the_readme_shows_the_table() -> None:
    table = load_rules(COMPILER_V2)
    covered = {rule.field for rule in table.rules}
    schema = json.loads(schema_texts()["config.schema.json"])
    missing = [f for f in _leaves(schema, schema, "") if not any(f == c or f.startswith(c + ".") for c in covered)]
    assert missing == []
    codes = [r.code for r in table.rules if r.action == "refuse"]
    assert len(codes) == len(set(codes))
    readme = (ROOT / "miniverl" / "handoff" / "README.md").read_text()
    assert render_markdown(COMPILER_V2) in readme, "regenerate the v2 table in miniverl/handoff/README.md"


def test_a_ppo_plan_compiles_with_v2_and_its_critic_starts_from_the_bundle_adapter() -> None:
    config = _ppo()
    ir = compile_plan_ir(_plan(config), config)
    assert ir.compiler == COMPILER_V2 and isinstance(ir.algorithm, PpoIR)
    critic = ir.algorithm.critic
    assert (critic.adapter_dir, critic.value_head) == ("critic_adapter", "score_modules_to_save")
    assert critic.start == "seeded_head"
    run_ir = compile_plan_ir(_plan(config), config, start_adapter=True)
    assert isinstance(run_ir.algorithm, PpoIR) and run_ir.algorithm.critic.start == "run_checkpoint"
    assert emit_verl_config(ir)["critic"]["model"]["lora_adapter_path"] == "critic_adapter"


def _llama_config(**extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        **extra,
    }


def test_critic_lora_value_head_is_refused_where_verls_critic_head_is_not_score() -> None:
    from miniverl.handoff.critic_adapter import require_trained_head, token_classification_head

    config = _ppo()
    ir = ppo_ir(_plan(config), config)
    assert token_classification_head(_llama_config()) == "score"
    assert require_trained_head(ir, _llama_config()) == 16
    gpt2 = {"model_type": "gpt2", "vocab_size": 64, "n_embd": 16, "n_layer": 1, "n_head": 2}
    assert token_classification_head(gpt2) == "classifier"  # verl's LoRA wrap would not train miniverl's head
    for model_config in (gpt2, {"model_type": "no-such-model"}):
        with pytest.raises(HandoffRefusal) as caught:
            require_trained_head(ir, model_config)
        assert caught.value.code == "critic_lora_value_head" and caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"algorithm__ppo__whiten_advantages": False}, "unwhitened_gae"),
        ({"algorithm__old_logp": "rollout"}, "old_logp_from_rollout"),
        ({"rollout__prompts_per_cycle": 3}, "mini_batch_splits_groups"),
        ({"algorithm__ppo__critic_max_grad_norm": None}, "no_critic_grad_clip"),
        (
            {"models__critic": {"source": "hub", "model_id": "org/critic", "revision": HUB_REVISION}},
            "critic_other_base",
        ),
        ({"models__critic": {"source": "student", "lora": {"r": 4, "dropout": 0.1}}}, "critic_lora_dropout"),
        ({"models__critic": {"source": "student", "lora": {"r": 4, "alpha": 6.5}}}, "critic_lora_alpha_not_integer"),
        (
            {
                "models__reference": {"source": "student"},
                "algorithm__ppo__kl_coef": 0.1,
                "algorithm__ppo__kl_estimator": "k3",
            },
            "kl_k3_clamped",
        ),
        (
            {
                "models__reward": {"source": "local", "path": "rm"},
                "algorithm__rewards": [{"name": "reward_model", "weight": 1.0}],
            },
            "reward_model_local",
        ),
    ],
)
def test_v2_refusals_name_their_rule(changes: dict[str, Any], code: str) -> None:
    config = _ppo(**changes)
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == code


def test_an_nf4_ppo_plan_compiles_with_the_v2_note() -> None:
    config = _ppo(models__student__quantization="nf4")
    ir = compile_plan_ir(_plan(config), config)
    assert ir.compiler == COMPILER_V2
    assert ir.model.quantization.model_dump() == {"trained": "nf4", "handed_off": "none", "carried_over": False}
    assert any(d.startswith("nf4_not_carried_over: ") for d in ir.deviations)
    plain = _ppo()
    assert compile_plan_ir(_plan(plain), plain).model.quantization.carried_over is True


def test_ppo_ir_maps_gae_epochs_mini_batches_and_the_critic() -> None:
    config = _ppo()
    ir = ppo_ir(_plan(config), config)
    assert ir.compiler == COMPILER_V2 and isinstance(ir.algorithm, PpoIR)
    assert ir.algorithm.mini_batch_prompts == 2 and ir.rollout.micro_batch_per_gpu == 2
    assert not any(d.startswith("critic_head_init") for d in ir.deviations)  # the head is carried exactly
    verl = emit_verl_config(ir)
    actor, critic = verl["actor_rollout_ref"]["actor"], verl["critic"]
    assert verl["algorithm"]["adv_estimator"] == "gae"
    assert (verl["algorithm"]["gamma"], verl["algorithm"]["lam"]) == (0.99, 0.9)
    assert actor["ppo_epochs"] == critic["ppo_epochs"] == 2
    assert actor["ppo_mini_batch_size"] == critic["ppo_mini_batch_size"] == 2
    assert critic["enable"] is True and critic["cliprange_value"] == 0.5
    assert critic["optim"]["lr"] == 3e-5 and critic["optim"]["clip_grad"] == critic["grad_clip"] == 1.0
    assert critic["model"]["path"] == verl["actor_rollout_ref"]["model"]["path"]
    assert (critic["model"]["lora_rank"], critic["model"]["lora_alpha"]) == (16, 32)
    assert verl["trainer"]["max_critic_ckpt_to_keep"] == 2
    from miniverl.handoff.launch import launch_script

    script = launch_script(ir, "miniverl_ppo")
    assert 'critic.model.path="$MODEL_PATH"' in script  # launch.sh resolves it once
    assert 'critic.model.lora_adapter_path="$HERE/critic_adapter"' in script


def test_ppo_kl_in_reward_maps_to_verls_fixed_controller() -> None:
    config = _ppo(models__reference={"source": "student"}, algorithm__ppo__kl_coef=0.05)
    verl = emit_verl_config(ppo_ir(_plan(config), config))
    assert verl["algorithm"]["use_kl_in_reward"] is True and verl["algorithm"]["kl_penalty"] == "k1"
    assert verl["algorithm"]["kl_ctrl"] == {"type": "fixed", "kl_coef": 0.05}


def test_compiling_ppo_twice_gives_the_golden_digests() -> None:
    config = _ppo()
    first, second = ppo_ir(_plan(config), config), ppo_ir(_plan(config), config)
    assert first == second
    digests = {
        "ir_digest": ir_digest(first),
        "rules_digest": rules_digest(COMPILER_V2),
        "verl_config_sha256": _sha(emit_verl_config(first)),
    }
    golden = json.loads(GOLDEN.read_text())
    assert digests == golden, "the v2 compiler's output changed: review it, then update tests/golden/handoff-v2.json"
