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
from miniverl.handoff.native import OPTIONAL, flatten, import_native, native_diff, native_to_config, parse_bindings
from miniverl.handoff.native_rules import BINDINGS, RULES, RUNTIME_KEYS, import_rules_digest
from miniverl.handoff.rules import HandoffRefusal, load_rules

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "examples" / "verl-native-grpo.yaml"
NATIVE_PPO = ROOT / "examples" / "verl-native-ppo.yaml"
NATIVE_GRPO_2X2 = ROOT / "examples" / "verl-native-grpo-2x2.yaml"
GOLDEN = ROOT / "tests" / "golden" / "handoff-v4.json"
BIND = {"model": "smollm2-135m-instruct", "device": "cpu"}


def _native(path: Path = NATIVE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _ppo() -> dict[str, Any]:
    return _native(NATIVE_PPO)


DELETE = object()


def _with(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of ``data`` with dotted keys (``__`` for ``.``) set; the value ``DELETE`` removes the key."""
    data = copy.deepcopy(data)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
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


@pytest.mark.parametrize("path", [NATIVE, NATIVE_PPO, NATIVE_GRPO_2X2], ids=["grpo", "ppo", "grpo-2x2"])
def test_every_key_of_the_examples_has_a_rule_and_each_states_every_map_key_of_its_estimator(path: Path) -> None:
    data = _native(path)
    flat = flatten(data)
    algo = "ppo" if data["algorithm"]["adv_estimator"] == "gae" else "grpo"
    assert set(flat) <= {rule.key for rule in RULES}
    required = {r.key for r in RULES if r.action == "map" and r.to not in OPTIONAL and r.only in (None, algo)}
    assert required <= set(flat)


def test_the_harness_inputs_are_the_examples_byte_for_byte() -> None:
    workloads = ROOT / "harness" / "workloads"
    for example in (NATIVE, NATIVE_PPO, NATIVE_GRPO_2X2):
        assert (workloads / example.name).read_bytes() == example.read_bytes(), example.name


def test_the_bundle_emits_only_keys_the_import_table_knows() -> None:
    """Round trip: every key compiler v1 (GRPO) or v2 (PPO) emits has an import rule (or is a bundle path)."""
    from miniverl.handoff.compiler import compile_plan_ir
    from miniverl.handoff.emit import emit_verl_config
    from tests.unit.test_handoff_compiler import _compile, _plan
    from tests.unit.test_handoff_compiler_v2 import _ppo as _ppo_config

    rules = {rule.key for rule in RULES}
    assert set(flatten(emit_verl_config(_compile()))) - rules == set()
    ppo = _ppo_config()
    emitted = set(flatten(emit_verl_config(compile_plan_ir(_plan(ppo), ppo))))
    assert emitted - rules == {"critic.model.lora_adapter_path"}
    assert "critic.model.lora_adapter_path" in RUNTIME_KEYS  # the bundle's critic_adapter/ (value head included)


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        ("trainer.wandb_extra", 1, "unknown_native_key"),
        ("critic.enable", True, "native_critic_enable"),  # a critic with GRPO: miniverl's GRPO has none
        ("algorithm.adv_estimator", "gae", "native_critic_enable"),  # gae with critic.enable false
        ("algorithm.adv_estimator", "rloo", "native_adv_estimator"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 3, "mini_batch_splits_groups"),  # 2 prompts per step
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 4, "mini_batch_splits_groups"),
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
        ("trainer.nnodes", 2, "native_multi_node"),
        ("trainer.critic_warmup", 1, "native_critic_warmup"),
        ("algorithm.kl_ctrl.type", "adaptive", "native_adaptive_kl"),
        ("data.truncation", "left", "native_truncation"),
    ],
)
def test_named_refusals(path: str, value: Any, code: str) -> None:
    assert _refusal(_with(_native(), **{path.replace(".", "__"): value})) == code


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        ("critic.enable", False, "native_critic_enable"),
        ("critic.strategy", "megatron", "native_strategy"),
        ("critic.model.lora_rank", 0, "critic_full_parameter"),
        ("critic.model.lora_rank", DELETE, "native_key_missing"),  # verl's default 0: a full-parameter critic
        ("critic.model.target_modules", "all-linear", "native_target_modules"),
        ("critic.model.path", "Qwen/Qwen3-0.6B", "critic_other_base"),
        ("critic.model.path", DELETE, "critic_other_base"),  # verl's default path is not the actor's
        ("critic.ppo_mini_batch_size", 3, "mini_batch_splits_groups"),
        ("critic.shuffle", False, "native_critic_shuffle"),
        ("critic.data_loader_seed", 42, "native_seeds_differ"),
        ("critic.loss_agg_mode", "seq-mean-token-mean", "native_loss_agg_mode"),
        ("critic.cliprange_value", DELETE, "native_key_missing"),
        ("critic.optim.lr", DELETE, "native_key_missing"),
        ("critic.optim.weight_decay", 0.01, "native_critic_optim"),
        ("critic.optim.weight_decay", DELETE, "native_critic_optim"),  # verl's default 0.01, the actor's 0.0
        ("critic.optim.betas", [0.9, 0.95], "native_critic_optim"),
        ("critic.optim.override_optimizer_config", {"eps": 1e-6}, "native_critic_optim"),
        ("critic.optim.lr_warmup_steps", 5, "native_lr_warmup"),
        ("critic.optim.lr_scheduler_type", "cosine", "native_lr_schedule"),
        ("critic.fsdp.model_dtype", "bf16", "native_dtypes_differ"),
        ("critic.fsdp.dtype", "bfloat16", "native_dtypes_differ"),
        ("critic.use_dynamic_bsz", True, "unknown_native_key"),
        ("algorithm.gamma", DELETE, "native_key_missing"),
        ("algorithm.lam", DELETE, "native_key_missing"),
        ("trainer.max_critic_ckpt_to_keep", 5, "native_checkpoint_retention"),
        ("trainer.nnodes", 4, "native_multi_node"),
    ],
)
def test_named_refusals_of_a_native_ppo_file(path: str, value: Any, code: str) -> None:
    assert _refusal(_with(_ppo(), **{path.replace(".", "__"): value})) == code


@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_verls_fsdp1_and_fsdp2_import_as_the_same_run(strategy: str) -> None:
    """Bundles emit FSDP2 (verl's FSDP1 cannot hand a LoRA adapter to vLLM on one GPU); a user's FSDP1 file is the
    same math, and megatron stays refused (above)."""
    native = _ppo()
    changed = _with(native, actor_rollout_ref__actor__strategy=strategy, critic__strategy=strategy)
    assert _import(changed) == _import(native)
    assert _refusal(_with(native, actor_rollout_ref__actor__strategy="megatron")) == "native_strategy"


def test_the_native_ppo_example_maps_to_a_miniverl_ppo_config_with_a_lora_critic() -> None:
    config = MiniverlConfig.model_validate(_import(_ppo()))
    assert config.algorithm.name == "ppo"
    ppo = config.algorithm.ppo
    assert (ppo.ppo_epochs, ppo.mini_batches, ppo.shuffle_mini_batches) == (2, 2, True)  # 4 actor steps
    assert (ppo.critic_ppo_epochs, ppo.critic_mini_batches) == (1, 2)  # 2 critic steps
    assert (ppo.critic_epoch_count * ppo.critic_mini_batch_count, ppo.ppo_epochs * ppo.mini_batches) == (2, 4)
    assert (ppo.gamma, ppo.lam, ppo.value_clip, ppo.whiten_advantages) == (1.0, 0.95, 0.5, True)
    assert (ppo.clip_low, ppo.clip_high, ppo.critic_learning_rate, ppo.critic_max_grad_norm) == (0.2, 0.2, 1e-4, 1.0)
    assert ppo.kl_coef == 0.0 and config.models.reference is None
    critic = config.models.critic
    assert critic is not None and critic.source == "student" and critic.lora is not None
    assert (critic.lora.r, critic.lora.alpha, critic.lora.dropout) == (8, 16, 0.0)
    assert critic.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert config.train.gradient_accumulation_steps == 4  # one mini-batch: 1 prompt x 4 samples
    assert (config.rollout.prompts_per_cycle, config.rollout.samples_per_prompt) == (2, 4)


def test_critic_passes_and_mini_batches_left_out_are_the_actors_as_in_verl() -> None:
    data = _with(_ppo(), critic__ppo_epochs=DELETE, critic__ppo_mini_batch_size=DELETE, critic__shuffle=DELETE)
    config, decisions = native_to_config(flatten(data), BIND)
    ppo = MiniverlConfig.model_validate(config).algorithm.ppo
    assert (ppo.critic_ppo_epochs, ppo.critic_mini_batches) == (None, None)  # None: the actor's, verl's default
    assert (ppo.critic_epoch_count, ppo.critic_mini_batch_count) == (2, 2)
    assert "critic.ppo_epochs" not in decisions
    data = _with(_ppo(), critic__ppo_epochs=3, critic__ppo_mini_batch_size=2)
    ppo = MiniverlConfig.model_validate(_import(data)).algorithm.ppo
    assert (ppo.critic_ppo_epochs, ppo.critic_mini_batches) == (3, 1)


def test_grpo_passes_and_mini_batches_map_instead_of_being_refused() -> None:
    data = _with(_native(), actor_rollout_ref__actor__ppo_epochs=2, actor_rollout_ref__actor__ppo_mini_batch_size=1)
    data["actor_rollout_ref"]["actor"]["shuffle"] = True
    grpo = MiniverlConfig.model_validate(_import(data)).algorithm.grpo
    assert (grpo.ppo_epochs, grpo.mini_batches, grpo.shuffle_mini_batches) == (2, 2, True)
    example = MiniverlConfig.model_validate(_import(_native())).algorithm.grpo
    assert (example.ppo_epochs, example.mini_batches, example.shuffle_mini_batches) == (1, 1, False)
    assert MiniverlConfig.model_validate(_import(_native(NATIVE_GRPO_2X2))).algorithm.grpo == grpo


def test_keys_of_the_other_estimator_are_unused_not_mapped() -> None:
    """A GRPO file may carry critic and GAE settings verl never reads for it; a PPO file the GRPO normalization."""
    grpo = _with(_native(), critic=copy.deepcopy(_ppo()["critic"]) | {"enable": False}, algorithm__gamma=0.9)
    config, decisions = native_to_config(flatten(grpo), BIND)
    assert config["algorithm"].keys() == {"grpo", "name", "rewards"} and "critic" not in config["models"]
    assert decisions["critic.model.lora_rank"] == decisions["algorithm.gamma"] == "unused"
    assert decisions["critic.enable"] == "map:models.critic"
    ppo = _with(_ppo(), algorithm__norm_adv_by_std_in_grpo=False)
    config, decisions = native_to_config(flatten(ppo), BIND)
    assert decisions["algorithm.norm_adv_by_std_in_grpo"] == "unused" and "grpo" not in config["algorithm"]


def test_a_native_ppo_kl_term_maps_with_the_actors_base_as_reference() -> None:
    data = _with(_ppo(), algorithm__use_kl_in_reward=True, algorithm__kl_penalty="low_var_kl")
    data["algorithm"]["kl_ctrl"]["kl_coef"] = 0.05
    config = MiniverlConfig.model_validate(_import(data))
    ppo = config.algorithm.ppo
    assert (ppo.kl_coef, ppo.kl_mode, ppo.kl_estimator) == (0.05, "reward", "low_var_kl")
    assert config.models.reference is not None and config.models.reference.source == "student"
    assert _refusal(_with(data, algorithm__kl_penalty="abs")) == "native_kl_estimator"
    for verl_name, miniverl_name in (("k3", "low_var_kl"), ("kl", "k1"), ("mse", "k2")):  # verl's other names
        imported = _import(_with(data, algorithm__kl_penalty=verl_name))["algorithm"]["ppo"]
        assert imported["kl_estimator"] == miniverl_name
    loss = _with(_ppo(), actor_rollout_ref__actor__use_kl_loss=True, actor_rollout_ref__actor__kl_loss_coef=0.1)
    ppo = MiniverlConfig.model_validate(_import(loss)).algorithm.ppo
    assert (ppo.kl_coef, ppo.kl_mode, ppo.kl_estimator) == (0.1, "loss", "low_var_kl")


def test_a_missing_mapped_key_is_refused_not_defaulted() -> None:
    data = copy.deepcopy(_native())
    del data["actor_rollout_ref"]["actor"]["optim"]["weight_decay"]  # verl's default 0.01 would apply unseen
    assert _refusal(data) == "native_key_missing"


def test_kl_loss_and_in_reward_kl_map_and_verls_k3_is_its_clamped_low_var_kl() -> None:
    data = copy.deepcopy(_native())
    data["actor_rollout_ref"]["actor"] |= {"use_kl_loss": True, "kl_loss_coef": 0.05, "kl_loss_type": "low_var_kl"}
    imported = _import(data)
    grpo = imported["algorithm"]["grpo"]
    assert (grpo["kl_coef"], grpo["kl_mode"], grpo["kl_estimator"]) == (0.05, "loss", "low_var_kl")
    reference = MiniverlConfig.model_validate(imported).models.reference  # verl's: the actor's own base
    assert reference is not None and reference.source == "student"
    data["actor_rollout_ref"]["actor"]["kl_loss_type"] = "k3"  # verl's k3 is clamped: miniverl's low_var_kl
    assert _import(data)["algorithm"]["grpo"]["kl_estimator"] == "low_var_kl"
    data["actor_rollout_ref"]["actor"]["kl_loss_type"] = "k3+"  # straight-through: no miniverl counterpart
    assert _refusal(data) == "native_kl_estimator"
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
    ppo = import_native(NATIVE_PPO, ["model=smollm2-135m-instruct", "device=cpu", "trajectory_batch_size=4"])
    assert ppo.direct_config is not None and ppo.config["algorithm"]["name"] == "ppo"
    golden = json.loads(GOLDEN.read_text())
    assert golden == {
        "native_sha256": direct.native.sha256,
        "rules_digest": import_rules_digest(),
        "import_digest": direct.import_digest,
        "v1_rules_digest": json.loads((ROOT / "tests" / "golden" / "handoff-v1.json").read_text())["rules_digest"],
        "ppo_native_sha256": ppo.direct_config.native.sha256,
        "ppo_import_digest": ppo.direct_config.import_digest,
        "v2_rules_digest": json.loads((ROOT / "tests" / "golden" / "handoff-v2.json").read_text())["rules_digest"],
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


@pytest.mark.parametrize(
    "path",
    [
        "actor_rollout_ref.actor.ppo_mini_batch_size",
        "critic.ppo_epochs",
        "critic.model.lora_rank",
        "data.train_batch_size",
    ],
)
@pytest.mark.parametrize("value", ["two", 1.5, True])
def test_a_count_that_is_not_a_whole_number_is_one_named_refusal(path: str, value: Any) -> None:
    assert _refusal(_with(_ppo(), **{path.replace(".", "__"): value})) == "native_not_a_count"


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = copy.deepcopy(value)
    return nested


def test_native_ppo_diff_statuses_for_verl_defaults_the_one_seed_and_inactive_keys() -> None:
    """A key the native file leaves out is equal only when the bundle states verl's own value for it."""
    native = _with(_ppo(), critic__ppo_epochs=DELETE, critic__data_loader_seed=DELETE, trainer__critic_warmup=DELETE)
    raw = yaml.safe_dump(native).encode()
    bundle = flatten(_ppo())  # the example's values: critic.ppo_epochs 1, critic.data_loader_seed 0, critic_warmup 0
    bundle.pop("trainer.critic_warmup")
    bundle.pop("algorithm.kl_penalty")  # off: the export leaves the in-reward KL settings out
    bundle["critic.ppo_epochs"] = 2  # verl's default: the actor's ppo_epochs
    diff = native_diff(raw, _nest(bundle))
    status = {e["key"]: e["status"] for e in diff["entries"]}
    assert diff["semantically_equal"], [e for e in diff["entries"] if e["status"] in ("changed", "bundle_only")]
    assert status["critic.ppo_epochs"] == "default" and status["critic.data_loader_seed"] == "derived"
    assert status["algorithm.kl_penalty"] == "ignored"  # use_kl_in_reward false on both sides
    bundle["critic.ppo_epochs"] = 1  # not what verl would use for the absent key: a real change
    diff = native_diff(raw, _nest(bundle))
    assert not diff["semantically_equal"] and diff["counts"]["bundle_only"] == 1
    bundle["critic.ppo_epochs"], bundle["critic.data_loader_seed"] = 2, 7  # not the one seed
    assert not native_diff(raw, _nest(bundle))["semantically_equal"]
    bundle["critic.data_loader_seed"] = 0
    bundle["algorithm.use_kl_in_reward"] = True  # the switch on in the bundle: its settings count again
    diff = native_diff(raw, _nest(bundle))
    assert {e["key"]: e["status"] for e in diff["entries"]}["algorithm.kl_penalty"] == "native_only"
    assert not diff["semantically_equal"]


def test_native_diff_ignores_the_other_estimators_keys_but_not_a_changed_critic() -> None:
    grpo = _with(_native(), critic=copy.deepcopy(_ppo()["critic"]) | {"enable": False}, algorithm__lam=0.5)
    bundle = flatten(_native())  # the export of a GRPO plan: critic {enable: false}, no GAE keys
    diff = native_diff(yaml.safe_dump(grpo).encode(), _nest(bundle))
    assert diff["semantically_equal"]
    status = {e["key"]: e["status"] for e in diff["entries"]}
    assert status["critic.model.lora_rank"] == status["algorithm.lam"] == "ignored"
    raw = NATIVE_PPO.read_bytes()
    bundle = flatten(_ppo())
    bundle["critic.cliprange_value"] = 0.2
    diff = native_diff(raw, _nest(bundle))
    assert not diff["semantically_equal"] and diff["counts"]["changed"] == 1


def test_verls_other_kl_names_are_the_same_in_the_native_diff() -> None:
    data = _with(_ppo(), algorithm__use_kl_in_reward=True, algorithm__kl_penalty="k3")
    bundle = _with(data, algorithm__kl_penalty="low_var_kl")  # what the export writes for miniverl's low_var_kl
    diff = native_diff(yaml.safe_dump(data).encode(), bundle)
    assert diff["semantically_equal"]
    assert {e["key"]: e["status"] for e in diff["entries"]}["algorithm.kl_penalty"] == "same"
    assert not native_diff(yaml.safe_dump(data).encode(), _with(data, algorithm__kl_penalty="k1"))["semantically_equal"]


@pytest.mark.parametrize(
    ("path", "value", "code"),
    [
        ("algorithm.adv_estimator", ["gae"], "native_adv_estimator"),
        ("algorithm.kl_penalty", ["k1"], "native_kl_estimator"),
        ("algorithm.kl_penalty", {"name": "k1"}, "unknown_native_key"),  # flattened: kl_penalty.name
    ],
)
def test_a_kl_or_estimator_name_that_is_not_a_string_is_one_named_refusal(path: str, value: Any, code: str) -> None:
    data = _with(_ppo(), algorithm__use_kl_in_reward=True, **{path.replace(".", "__"): value})
    assert _refusal(data) == code


def test_verls_liger_switch_maps_to_the_fused_kernels_and_a_non_boolean_is_refused() -> None:
    on = MiniverlConfig.model_validate(_import(_with(_native(), actor_rollout_ref__model__use_liger=True)))
    off = MiniverlConfig.model_validate(_import(_with(_native(), actor_rollout_ref__model__use_liger=False)))
    absent = MiniverlConfig.model_validate(_import(_native()))
    assert (on.train.fused_kernels, off.train.fused_kernels, absent.train.fused_kernels) == ("liger", "none", "none")
    assert _refusal(_with(_native(), actor_rollout_ref__model__use_liger="yes")) == "native_use_liger"
