"""Compiler v1: the IR, the rules table, the refusals and the canonical digests (golden files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from miniverl.config.loader import validate_config
from miniverl.config.schema import MiniverlConfig
from miniverl.handoff.compiler import compile_plan_ir, compile_v1, require_compiler
from miniverl.handoff.emit import emit_verl_config
from miniverl.handoff.ir import COMPILER_V1, COMPILER_V2, COMPILER_V4, ExperimentIR, ir_digest
from miniverl.handoff.rules import HandoffRefusal, load_rules, render_markdown, rules_digest
from miniverl.records import DataBinding, PlacementPlan, PlanRecord
from miniverl.schemas import schema_texts

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "handoff-v1.json"
HUB_REVISION = "0" * 39 + "1"


def _config(**changes: Any) -> MiniverlConfig:
    data: dict[str, Any] = {
        "run": {"name": "golden", "seed": 3},
        "models": {
            "dtype": "bfloat16",
            "student": {
                "source": "hub",
                "model_id": "Qwen/Qwen3-0.6B",
                "revision": HUB_REVISION,
                "lora": {"r": 16, "alpha": 32},
            },
        },
        "data": {"path": "prompts.parquet"},
        "rollout": {"prompts_per_cycle": 2, "samples_per_prompt": 4, "max_new_tokens": 64, "top_k": 0},
        "algorithm": {
            "name": "grpo",
            "rewards": [
                {"name": "calculator_exact", "weight": 1.0},
                {"name": "target_length", "weight": 0.5, "params": {"target_tokens": 16}},
            ],
        },
        "train": {"cycles": 2, "learning_rate": 1e-5, "trajectory_batch_size": 4, "adam_eps": 1e-7},
    }
    for dotted, value in changes.items():
        node = data
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return validate_config(data, origin="test")


def _plan(config: MiniverlConfig) -> PlanRecord:
    models: dict[str, Any] = {"student": {"source": "hub", "model_id": "Qwen/Qwen3-0.6B", "revision": HUB_REVISION}}
    if config.models.reward is not None:
        from miniverl.rewards.reward_model import reward_model_identity

        spec = config.models.reward
        models["reward"] = (
            reward_model_identity(spec, fetch=False)[0] if spec.source != "local" else {"source": "local"}
        )
    return PlanRecord(
        miniverl_version="0.1.0",
        config=config.model_dump(mode="json"),
        overrides=[],
        config_digest="a" * 64,
        data=DataBinding(path="prompts.parquet", sha256="b" * 64, rows=16),
        models=models,
        placement=PlacementPlan(
            device="cuda",
            runtime="dual_model",
            physical_models=1,
            dtype="bfloat16",
            quantization="none",
            estimated_weight_bytes=None,
            estimated_trainable_params=None,
            estimated_optimizer_bytes=None,
            basis="test",
        ),
        cycles=2,
        trajectories_per_cycle=8,
        updates=2,
        plan_digest="c" * 64,
    )


def _compile(**changes: Any) -> ExperimentIR:
    config = _config(**changes)
    return compile_plan_ir(_plan(config), config)


def test_compiling_twice_gives_the_golden_digests() -> None:
    first, second = _compile(), _compile()
    assert first == second
    digests = {
        "ir_digest": ir_digest(first),
        "rules_digest": rules_digest(),
        "verl_config_sha256": _sha(emit_verl_config(first)),
    }
    assert ir_digest(second) == digests["ir_digest"]
    golden = json.loads(GOLDEN.read_text())
    assert digests == golden, "the compiler's output changed: review it, then update tests/golden/handoff-v1.json"


def _sha(value: Any) -> str:
    from miniverl.canonical import sha256_json

    return sha256_json(value)


def test_ir_maps_the_grpo_fields() -> None:
    ir = _compile()
    assert ir.compiler == COMPILER_V1
    assert ir.model.binding == "hub" and ir.model.revision == HUB_REVISION
    assert (ir.lora.rank, ir.lora.alpha) == (16, 32)
    assert ir.rollout.top_k == -1 and ir.rollout.samples_per_prompt == 4
    assert ir.optim.eps == 1e-7 and ir.optim.weight_decay == 0.0
    assert ir.reward.needs_response_token_count is True
    verl = emit_verl_config(ir)
    actor = verl["actor_rollout_ref"]["actor"]
    assert verl["defaults"] == ["ppo_trainer", "_self_"]
    assert verl["algorithm"]["adv_estimator"] == "grpo"
    assert verl["data"]["train_batch_size"] == actor["ppo_mini_batch_size"] == 2
    assert actor["optim"]["override_optimizer_config"] == {"eps": 1e-7}
    assert actor["fsdp_config"]["model_dtype"] == "bf16"
    assert verl["actor_rollout_ref"]["model"]["path"] == "Qwen/Qwen3-0.6B"
    assert verl["trainer"]["n_gpus_per_node"] == 1 and verl["trainer"]["total_training_steps"] == 2
    assert _compile(train__trajectory_batch_size=3).rollout.micro_batch_per_gpu == 2  # 8 trajectories: even split
    assert _compile(train__trajectory_batch_size="auto").rollout.micro_batch_per_gpu == 8


def test_an_nf4_plan_compiles_on_the_full_precision_base_and_says_so() -> None:
    plain, nf4 = _compile(), _compile(models__student__quantization="nf4")
    assert plain.model.quantization.model_dump() == {"trained": "none", "handed_off": "none", "carried_over": True}
    assert nf4.model.quantization.model_dump() == {"trained": "nf4", "handed_off": "none", "carried_over": False}
    # the same base model (hub id, revision, identity) and precision: only the quantization record differs
    same = {"quantization"}
    assert nf4.model.model_dump(exclude=same) == plain.model.model_dump(exclude=same)
    assert nf4.model.dtype == "bfloat16"
    notes = [d for d in nf4.deviations if d.startswith("nf4_not_carried_over: ")]
    assert len(notes) == 1 and "dequantization error" in notes[0]
    assert not any(d.startswith("nf4_not_carried_over") for d in plain.deviations)
    # verl's config does not depend on the quantization miniverl trained over
    assert emit_verl_config(nf4) == emit_verl_config(plain)
    rule = next(r for r in load_rules().rules if r.code == "nf4_not_carried_over")
    assert (rule.action, rule.field) == ("drop_with_note", "models.student.quantization")
    assert rule.when == "quantization == nf4"


def test_quantization_record_holds_carried_over_to_its_definition() -> None:
    from miniverl.handoff.ir import QuantizationIR

    with pytest.raises(ValueError, match="carried_over must be False"):
        QuantizationIR(trained="nf4", carried_over=True)
    with pytest.raises(ValueError, match="carried_over must be True"):
        QuantizationIR(trained="none", carried_over=False)
    with pytest.raises(ValueError):
        QuantizationIR.model_validate({"trained": "nf4", "handed_off": "nf4", "carried_over": True})


def test_a_coded_rule_needs_its_code_and_notes_come_only_from_drop_with_note_rules() -> None:
    from miniverl.handoff.rules import Rule, note, refusal_rule

    assert note("nf4_not_carried_over").startswith("nf4_not_carried_over: verl 0.9 has no NF4 base weights")
    with pytest.raises(KeyError):
        note("grpo_eps")  # a refusal is never turned into a note
    with pytest.raises(KeyError):
        refusal_rule("nf4_not_carried_over")  # nor a note into a refusal
    coded = [r for r in load_rules().rules if r.action in ("refuse", "drop_with_note")]
    assert all(r.code for r in coded)
    assert not [r for r in load_rules().rules if r.action not in ("refuse", "drop_with_note") and r.code]
    assert Rule(field="f", action="drop_with_note", verl_keys=(), reason="r", code="c").code == "c"


def test_ir_forbids_unknown_fields() -> None:
    data = _compile().model_dump(mode="json")
    data["rollout"]["surprise"] = 1
    with pytest.raises(ValueError, match="surprise"):
        ExperimentIR.model_validate(data)


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"models__student__lora": {"r": 8, "alpha": 16, "dropout": 0.1}}, "lora_dropout"),
        ({"models__student__lora": {"r": 8, "alpha": 12.5}}, "lora_alpha_not_integer"),
        ({"models__student__lora": {"enabled": False}}, "lora_disabled"),
        ({"algorithm__grpo": {"eps": 1e-8}}, "grpo_eps"),
        ({"rollout__use_chat_template": False}, "no_chat_template"),
        ({"train__max_grad_norm": None}, "no_grad_clip"),
        ({"algorithm__old_logp": "rollout"}, "old_logp_from_rollout"),
        (
            {
                "models__student": {
                    "source": "hub",
                    "model_id": "m",
                    "revision": "main",
                    "allow_mutable_revision": True,
                },
            },
            "mutable_revision",
        ),
        ({"models__student": {"source": "gguf", "path": "m.gguf"}}, "gguf_weights"),
    ],
)
def test_refusals_name_their_rule(changes: dict[str, Any], code: str) -> None:
    with pytest.raises(HandoffRefusal) as caught:
        _compile(**changes)
    assert caught.value.code == code
    assert caught.value.exit_code == 2
    assert f"handoff refused ({code})" in str(caught.value)


def test_refuses_strict_opd_with_teacher() -> None:
    base = _config().model_dump(mode="json")
    base["algorithm"]["name"] = "opd"
    base["models"]["teacher"] = {"source": "student", "privileged_context": {}}
    config = validate_config(base, origin="test")
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == "strict_opd_reverse_kl"


def test_refuses_shared_backbone() -> None:
    base = _config().model_dump(mode="json")
    base["models"]["runtime"] = "shared_backbone"
    adapter = {"source": "hub", "path": "org/teacher", "revision": HUB_REVISION}
    base["models"]["teacher"] = {"source": "student", "adapter": adapter}
    config = validate_config(base, origin="test")
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == "shared_backbone_adapters"


def _kl_config(reference: dict[str, Any], **grpo: Any) -> MiniverlConfig:
    base = _config().model_dump(mode="json")
    base["algorithm"]["grpo"].update({"kl_coef": 0.01, **grpo})
    base["models"]["reference"] = reference
    return validate_config(base, origin="test")


@pytest.mark.parametrize("estimator", ["k1", "k2", "low_var_kl"])
def test_grpo_kl_loss_maps_to_verl_kl_loss(estimator: str) -> None:
    config = _kl_config({"source": "student"}, kl_estimator=estimator, kl_mode="loss")
    verl = emit_verl_config(compile_plan_ir(_plan(config), config))
    actor = verl["actor_rollout_ref"]["actor"]
    assert (actor["use_kl_loss"], actor["kl_loss_coef"], actor["kl_loss_type"]) == (True, 0.01, estimator)
    assert verl["algorithm"]["use_kl_in_reward"] is False


def test_grpo_kl_reward_maps_to_verl_in_reward_kl_with_a_fixed_controller() -> None:
    same_base = {"source": "hub", "model_id": "Qwen/Qwen3-0.6B", "revision": HUB_REVISION}
    config = _kl_config(same_base, kl_estimator="k1", kl_mode="reward")
    verl = emit_verl_config(compile_plan_ir(_plan(config), config))
    assert verl["actor_rollout_ref"]["actor"]["use_kl_loss"] is False
    algorithm = verl["algorithm"]
    assert algorithm["use_kl_in_reward"] is True and algorithm["kl_penalty"] == "k1"
    assert algorithm["kl_ctrl"] == {"type": "fixed", "kl_coef": 0.01}


@pytest.mark.parametrize(
    ("reference", "grpo", "code"),
    [
        ({"source": "student"}, {"kl_estimator": "k3"}, "kl_k3_clamped"),
        (
            {"source": "hub", "model_id": "other/model", "revision": HUB_REVISION},
            {"kl_estimator": "k1"},
            "reference_not_actor_base",
        ),
        (
            {"source": "student", "adapter": {"source": "hub", "path": "org/ref", "revision": HUB_REVISION}},
            {"kl_mode": "reward", "kl_estimator": "low_var_kl"},
            "reference_not_actor_base",
        ),
    ],
)
def test_grpo_kl_that_verl_cannot_express_is_refused(
    reference: dict[str, Any], grpo: dict[str, Any], code: str
) -> None:
    config = _kl_config(reference, **grpo)
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == code


def test_compilers_are_available_by_name() -> None:
    require_compiler(COMPILER_V1)
    require_compiler(COMPILER_V2)
    require_compiler(COMPILER_V4)  # direct-config (miniverl.handoff.native)
    with pytest.raises(Exception, match="unknown compiler"):
        require_compiler("verl-rl-v0.9-single-gpu-v3")


def test_rules_cover_every_config_field() -> None:
    """Each leaf of the config schema (or one of its parents) has a rule: nothing is silently ignored."""
    covered = {rule.field for rule in load_rules().rules}
    schema = json.loads(schema_texts()["config.schema.json"])
    missing = [f for f in _leaves(schema, schema, "") if not any(f == c or f.startswith(c + ".") for c in covered)]
    assert missing == []


def _leaves(schema: dict[str, Any], node: dict[str, Any], prefix: str) -> list[str]:
    ref = node.get("$ref") or next((o.get("$ref") for o in node.get("anyOf", []) if "$ref" in o), None)
    if ref:
        node = schema["$defs"][ref.rsplit("/", 1)[1]]
    props = node.get("properties")
    if not props:
        return [prefix]
    out: list[str] = []
    for key, child in props.items():
        path = f"{prefix}.{key}" if prefix else key
        if key in ("teacher", "reference") and prefix == "models":
            out.append(path)
            continue
        out += _leaves(schema, child, path)
    return out


def test_every_refusal_has_a_unique_code_and_the_readme_shows_the_table() -> None:
    codes = [r.code for r in load_rules().rules if r.action == "refuse"]
    assert len(codes) == len(set(codes))
    readme = (ROOT / "miniverl" / "handoff" / "README.md").read_text()
    assert render_markdown() in readme, "regenerate the table in miniverl/handoff/README.md from render_markdown()"


def test_bundle_manifest_schema_has_not_drifted() -> None:
    from miniverl.handoff.manifest import SCHEMA_PATH, schema_text

    assert (ROOT / SCHEMA_PATH).read_text() == schema_text(), "regenerate manifests/handoff/bundle-manifest.schema.json"


def test_a_ppo_plan_is_sent_to_compiler_v2_not_compiled_as_grpo() -> None:
    base = _config().model_dump(mode="json")
    base["algorithm"]["name"] = "ppo"
    base["train"]["gradient_accumulation_steps"] = None
    config = validate_config(base, origin="test")
    assert compile_plan_ir(_plan(config), config).compiler == "verl-rl-v0.9-single-gpu-v2"
    with pytest.raises(HandoffRefusal) as caught:
        compile_v1(_plan(config), config)  # v1 must never take a PPO plan
    assert caught.value.code == "ppo_compiler_v2"


@pytest.mark.parametrize("name", ["sft", "kd"])
def test_offline_algorithms_are_refused(name: str) -> None:
    base = _config().model_dump(mode="json")
    base["algorithm"]["name"] = name
    base["train"]["gradient_accumulation_steps"] = None
    base["models"]["teacher"] = {"source": "student", "privileged_context": {}}
    config = validate_config(base, origin="test")
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == "offline_algorithm"


def test_a_grpo_plan_with_a_reward_model_scores_it_in_the_reward_function() -> None:
    base = _config().model_dump(mode="json")
    base["models"]["reward"] = {"source": "tiny", "tiny": {"seed": 3}, "label": 0}
    base["algorithm"]["rewards"].append({"name": "reward_model", "weight": 0.5})
    config = validate_config(base, origin="test")
    ir = compile_plan_ir(_plan(config), config)
    rm = ir.reward.reward_model
    assert rm is not None and rm.weight == 0.5 and rm.spec["tiny"]["seed"] == 3
    assert rm.identity["source"] == "tiny" and "reward_model" not in [t.name for t in ir.reward.terms]
    assert any(d.startswith("reward_model_unbatched") for d in ir.deviations)
    assert emit_verl_config(ir)["reward_model"] == {"enable": False}
    from miniverl.handoff.launch import reward_file

    assert "REWARD_MODEL = json.loads(" in reward_file(ir)
    base["models"]["reward"] = {"source": "local", "path": "rm-dir"}
    config = validate_config(base, origin="test")
    with pytest.raises(HandoffRefusal) as caught:
        compile_plan_ir(_plan(config), config)
    assert caught.value.code == "reward_model_local"


def test_the_fused_kernels_choice_reaches_verls_liger_switch() -> None:
    """liger is verl's use_liger; miniverl's own triton kernels have no verl switch (verl runs HF's modules)."""
    emitted = {
        kind: emit_verl_config(_compile(train__fused_kernels=kind))["actor_rollout_ref"]["model"]["use_liger"]
        for kind in ("none", "triton", "liger")
    }
    assert emitted == {"none": False, "triton": False, "liger": True}
