"""Compiler v4 (direct-config): the import rules, the refusals, the bindings and the golden digests."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from miniverl.config.plan import load_plan
from miniverl.config.schema import MiniverlConfig
from miniverl.handoff.ir import COMPILER_V4
from miniverl.handoff.native import flatten, import_native, native_diff, native_to_config, parse_bindings
from miniverl.handoff.native_rules import BINDINGS, RULES, RUNTIME_KEYS, import_rules_digest
from miniverl.handoff.rules import HandoffRefusal, load_rules

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "examples" / "verl-native-grpo.yaml"
GOLDEN = ROOT / "tests" / "golden" / "handoff-v4.json"
BIND = {"model": "smollm2-135m-instruct", "device": "cpu"}


def _native() -> dict[str, Any]:
    data = yaml.safe_load(NATIVE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _import(data: dict[str, Any], bindings: dict[str, Any] | None = None) -> dict[str, Any]:
    config, _ = native_to_config(flatten(data), dict(bindings or BIND))
    return config


def _refusal(data: dict[str, Any], bindings: dict[str, Any] | None = None) -> str:
    with pytest.raises(HandoffRefusal) as info:
        _import(data, bindings)
    return info.value.code


@pytest.fixture()
def in_prompts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from miniverl.data import sample_dataset

    monkeypatch.chdir(tmp_path)
    sample_dataset("calculator", 8, 0, tmp_path / "prompts.parquet")
    return tmp_path


def test_example_maps_to_the_miniverl_config_it_states() -> None:
    config = MiniverlConfig.model_validate(_import(_native()))
    assert config.algorithm.name == "grpo"
    assert (config.rollout.prompts_per_cycle, config.rollout.samples_per_prompt) == (2, 4)
    assert (config.rollout.max_new_tokens, config.rollout.top_k, config.rollout.temperature) == (32, 0, 1.0)
    grpo = config.algorithm.grpo
    assert (grpo.clip_low, grpo.clip_high, grpo.norm_by_std, grpo.kl_coef) == (0.2, 0.28, True, 0.0)
    assert (config.train.learning_rate, config.train.weight_decay, config.train.adam_eps) == (1e-4, 0.0, 1e-8)
    assert (config.train.cycles, config.checkpoint.every_updates, config.checkpoint.keep_last) == (2, 1, 2)
    assert config.models.student.source == "builtin" and config.models.device == "cpu"
    lora = config.models.student.lora
    assert lora is not None and (lora.r, lora.alpha, lora.target_modules) == (
        8,
        16,
        ["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    assert [t.name for t in config.algorithm.rewards] == ["calculator_exact", "target_length"]
    assert config.run.name == "native-grpo-smollm2" and config.run.seed == 0


def test_every_rule_key_is_unique_and_every_check_has_a_code() -> None:
    keys = [rule.key for rule in RULES]
    assert len(keys) == len(set(keys))
    for rule in RULES:
        assert (rule.action in ("expect", "same")) == (rule.code is not None), rule.key
        assert rule.reason


def test_every_key_of_the_example_has_a_rule_and_the_example_states_every_map_key() -> None:
    flat = flatten(_native())
    table = {rule.key for rule in RULES}
    assert set(flat) <= table
    assert {r.key for r in RULES if r.action == "map" and r.to not in ("kl_coef", "kl_est")} <= set(flat)


def test_the_bundle_emits_only_keys_the_import_table_knows() -> None:
    """Round trip: every key compiler v1 emits (GRPO) has an import rule (or is the run's adapter)."""
    from miniverl.handoff.emit import emit_verl_config
    from tests.unit.test_handoff_compiler import _compile

    emitted = set(flatten(emit_verl_config(_compile())))
    assert emitted - {rule.key for rule in RULES} == set()


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        ("trainer.wandb_extra", 1, "unknown_native_key"),
        ("critic.enable", True, "critic_lora_value_head"),
        ("algorithm.adv_estimator", "gae", "critic_lora_value_head"),
        ("algorithm.adv_estimator", "rloo", "native_adv_estimator"),
        ("actor_rollout_ref.actor.ppo_epochs", 2, "grpo_ppo_epochs"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 1, "grpo_mini_batches"),
        ("actor_rollout_ref.actor.entropy_coeff", 0.01, "native_entropy_bonus"),
        ("actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-sum", "native_loss_agg_mode"),
        ("actor_rollout_ref.actor.optim.lr_warmup_steps", 10, "native_lr_warmup"),
        ("actor_rollout_ref.actor.optim.lr_scheduler_type", "cosine", "native_lr_schedule"),
        ("actor_rollout_ref.actor.data_loader_seed", 7, "native_seeds_differ"),
        ("actor_rollout_ref.rollout.dtype", "bfloat16", "native_dtypes_differ"),
        ("actor_rollout_ref.rollout.do_sample", False, "native_do_sample"),
        ("actor_rollout_ref.model.lora_rank", 0, "lora_disabled"),
        ("actor_rollout_ref.model.target_modules", "all-linear", "native_target_modules"),
        ("reward_model.enable", True, "native_reward_model_worker"),
        ("reward.reward_manager.name", "dapo", "native_reward_manager"),
        ("trainer.test_freq", 5, "native_validation"),
        ("algorithm.kl_ctrl.type", "adaptive", "native_adaptive_kl"),
        ("data.truncation", "left", "native_truncation"),
    ],
)
def test_named_refusals(path: str, value: Any, code: str) -> None:
    data = copy.deepcopy(_native())
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    assert _refusal(data) == code


def test_a_realistic_native_ppo_file_is_refused_for_its_critic_not_for_its_critic_keys() -> None:
    """A PPO file names critic.model/optim keys that have no import rule; the refusal still gives the reason."""
    data = copy.deepcopy(_native())
    data["algorithm"]["adv_estimator"] = "gae"
    data["critic"] = {
        "enable": True,
        "model": {"path": "HuggingFaceTB/SmolLM2-135M-Instruct", "lora_rank": 8, "lora_alpha": 16},
        "optim": {"lr": 1.0e-5},
        "ppo_mini_batch_size": 2,
        "ppo_micro_batch_size_per_gpu": 8,
    }
    assert _refusal(data) == "critic_lora_value_head"


def test_a_missing_mapped_key_is_refused_not_defaulted() -> None:
    data = copy.deepcopy(_native())
    del data["actor_rollout_ref"]["actor"]["optim"]["weight_decay"]  # verl's default 0.01 would apply unseen
    assert _refusal(data) == "native_key_missing"


def test_kl_loss_and_in_reward_kl_map_and_k3_is_refused() -> None:
    data = copy.deepcopy(_native())
    data["actor_rollout_ref"]["actor"] |= {"use_kl_loss": True, "kl_loss_coef": 0.05, "kl_loss_type": "low_var_kl"}
    grpo = _import(data)["algorithm"]["grpo"]
    assert (grpo["kl_coef"], grpo["kl_mode"], grpo["kl_estimator"]) == (0.05, "loss", "low_var_kl")
    data["actor_rollout_ref"]["actor"]["kl_loss_type"] = "k3"
    assert _refusal(data) == "kl_k3_clamped"
    data = copy.deepcopy(_native())
    data["algorithm"] |= {"use_kl_in_reward": True, "kl_penalty": "k1", "kl_ctrl": {"type": "fixed", "kl_coef": 0.1}}
    grpo = _import(data)["algorithm"]["grpo"]
    assert (grpo["kl_coef"], grpo["kl_mode"], grpo["kl_estimator"]) == (0.1, "reward", "k1")
    data["actor_rollout_ref"]["actor"] |= {"use_kl_loss": True, "kl_loss_coef": 0.05}
    assert _refusal(data) == "native_two_kl_terms"


def test_bindings_only_runtime_keys_and_a_resolvable_model(tmp_path: Path) -> None:
    assert parse_bindings(["model=smollm2-135m-instruct", "trajectory_batch_size=4"], None) == {
        "model": "smollm2-135m-instruct",
        "trajectory_batch_size": 4,
    }
    with pytest.raises(HandoffRefusal) as info:
        parse_bindings(["model=smollm2-135m-instruct", "train.cycles=9"], None)
    assert info.value.code == "not_a_runtime_binding"
    with pytest.raises(HandoffRefusal) as info:
        parse_bindings(["device=cpu"], None)
    assert info.value.code == "model_binding_missing"
    assert _refusal(_native(), {"model": "Qwen/Qwen3-0.6B"}) == "model_unresolvable"  # a hub id needs @40-hex
    hub = _import(_native(), {"model": "Qwen/Qwen3-0.6B@" + "a" * 40})["models"]["student"]
    assert (hub["source"], hub["model_id"], hub["revision"]) == ("hub", "Qwen/Qwen3-0.6B", "a" * 40)
    local = _import(_native(), {"model": str(tmp_path)})["models"]["student"]
    assert local["source"] == "local" and local["path"] == os.path.relpath(tmp_path)  # never an absolute path
    assert parse_bindings([f"model={tmp_path}"], None)["model"] == os.path.relpath(tmp_path)
    file = tmp_path / "bind.yaml"
    file.write_text("model: smollm2-135m-instruct\ndevice: cpu\n")
    assert parse_bindings(["device=cuda"], file) == {"model": "smollm2-135m-instruct", "device": "cuda"}
    assert set(BINDINGS) == {"model", "device", "quantization", "trajectory_batch_size", "batch_size"}


def test_plan_keeps_the_native_bytes_and_the_golden_digests(in_prompts_dir: Path) -> None:
    plan = import_native(NATIVE, ["model=smollm2-135m-instruct", "device=cpu", "trajectory_batch_size=4"])
    direct = plan.direct_config
    assert direct is not None and direct.compiler == COMPILER_V4
    raw = NATIVE.read_bytes()
    assert direct.native.text.encode("utf-8") == raw
    assert direct.native.sha256 == hashlib.sha256(raw).hexdigest() and direct.native.bytes == len(raw)
    again = import_native(NATIVE, ["model=smollm2-135m-instruct", "device=cpu", "trajectory_batch_size=4"])
    assert again.plan_digest == plan.plan_digest and again.direct_config == direct
    golden = json.loads(GOLDEN.read_text())
    assert golden == {
        "native_sha256": direct.native.sha256,
        "rules_digest": import_rules_digest(),
        "import_digest": direct.import_digest,
        "v1_rules_digest": json.loads((ROOT / "tests" / "golden" / "handoff-v1.json").read_text())["rules_digest"],
    }
    out = in_prompts_dir / "plan.json"
    out.write_text(json.dumps(plan.model_dump(mode="json")))
    loaded, _ = load_plan(out)
    assert loaded.direct_config == direct
    assert load_rules().compiler != COMPILER_V4  # the export stays v1's table


def test_a_plain_plan_has_no_direct_config_key(in_prompts_dir: Path) -> None:
    from miniverl.config.plan import build_plan

    plan = import_native(NATIVE, ["model=smollm2-135m-instruct"])
    plain = build_plan(MiniverlConfig.model_validate(plan.config), [])
    assert "direct_config" not in plain.model_dump(mode="json")


def test_native_diff_names_runtime_keys_and_real_changes() -> None:
    raw = NATIVE.read_bytes()
    bundle = flatten(_native())
    nested: dict[str, Any] = {}
    for key, value in bundle.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    assert native_diff(raw, nested)["semantically_equal"]
    nested["actor_rollout_ref"]["model"]["path"] = "model"  # runtime
    nested["trainer"]["project_name"] = "x"  # ignored
    diff = native_diff(raw, nested)
    assert diff["semantically_equal"] and diff["counts"]["runtime"] == 1 and diff["counts"]["ignored"] == 1
    nested["actor_rollout_ref"]["actor"]["optim"]["lr"] = 2e-4
    diff = native_diff(raw, nested)
    assert not diff["semantically_equal"] and diff["counts"]["changed"] == 1
    assert "actor_rollout_ref.model.path" in RUNTIME_KEYS


def test_a_recorded_extension_is_the_only_accepted_change_of_the_step_count() -> None:
    raw = NATIVE.read_bytes()
    steps = flatten(_native())["trainer.total_training_steps"]
    config = yaml.safe_load(raw)
    config["trainer"]["total_training_steps"] = steps + 1  # run --resume --extend 1
    extended = native_diff(raw, config, added_cycles=1)
    entry = next(e for e in extended["entries"] if e["key"] == "trainer.total_training_steps")
    assert entry["status"] == "extended" and extended["semantically_equal"] and extended["added_cycles"] == 1
    unexplained = native_diff(raw, config)  # no extension recorded: a real change
    assert not unexplained["semantically_equal"] and unexplained["counts"]["changed"] == 1
    assert not native_diff(raw, config, added_cycles=2)["semantically_equal"]  # 2 recorded, 1 found


def test_readme_holds_the_import_table() -> None:
    from miniverl.handoff.native_rules import render_markdown

    readme = (ROOT / "miniverl" / "handoff" / "README.md").read_text(encoding="utf-8")
    assert render_markdown() in readme, "regenerate the v4 table in miniverl/handoff/README.md from render_markdown()"


def test_modified_native_bytes_are_refused_at_handoff(in_prompts_dir: Path) -> None:
    from miniverl.handoff.native import verified_native

    direct = import_native(NATIVE, ["model=smollm2-135m-instruct"]).direct_config
    assert direct is not None and verified_native(direct) == NATIVE.read_bytes()
    tampered = direct.model_copy(update={"native": direct.native.model_copy(update={"text": direct.native.text + " "})})
    with pytest.raises(HandoffRefusal) as info:
        verified_native(tampered)
    assert info.value.code == "native_modified"
