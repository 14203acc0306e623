"""The import rules of compiler ``verl-rl-v0.9-single-gpu-v4``: native verl 0.9 keys -> miniverl fields.

The table is the inverse of compiler v1's export (``rules_v1.json``): each dotted key of a verl 0.9
``ppo_trainer``-layout YAML is one of

- ``map``: its value becomes ``field`` of the miniverl config (``to`` names a conversion);
- ``same``: it must equal the value of ``field``'s own native key (one seed, one dtype, ...);
- ``expect``: it must equal ``value`` (the only value miniverl computes the same way); otherwise the
  import stops with ``code``;
- ``runtime``: a placement or engine choice (device, micro-batches, rollout engine, paths); its
  native value is recorded but miniverl uses the user's ``runtime_bindings``;
- ``ignore``: logging, validation and bookkeeping with no effect on the math.

A key not in the table is refused (``unknown_native_key``); a ``map`` key that is absent is refused
(``native_key_missing``: verl's default would apply silently). Facts about verl 0.9.1's config
come from its ``ppo_trainer`` layout; no verl code is used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from miniverl.canonical import sha256_json

Action = Literal["map", "same", "expect", "runtime", "ignore"]
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."


class ImportRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    action: Action
    field: str | None = None
    to: str | None = None
    value: Any = None
    code: str | None = None
    reason: str


def _m(key: str, field: str, reason: str, to: str | None = None) -> ImportRule:
    return ImportRule(key=key, action="map", field=field, to=to, reason=reason)


def _e(key: str, value: Any, code: str, reason: str) -> ImportRule:
    return ImportRule(key=key, action="expect", value=value, code=code, reason=reason)


def _s(key: str, other: str, code: str, reason: str) -> ImportRule:
    return ImportRule(key=key, action="same", field=other, code=code, reason=reason)


def _r(key: str, binding: str, reason: str) -> ImportRule:
    return ImportRule(key=key, action="runtime", field=binding, reason=reason)


def _i(key: str, reason: str) -> ImportRule:
    return ImportRule(key=key, action="ignore", reason=reason)


RULES: tuple[ImportRule, ...] = (
    _i("hydra.searchpath", "Hydra's search path for verl's own defaults"),
    _i("defaults", "the Hydra defaults list (ppo_trainer)"),
    _m("data.train_files", "data.path", "a miniverl prompts Parquet (the bundle rewrites it in verl's columns)"),
    _r("data.val_files", "-", "validation is off (trainer.test_freq -1); the bundle points it at the train file"),
    _e("data.prompt_key", "prompt", "native_prompt_key", "the prompt column is miniverl's prompt"),
    _e("data.reward_fn_key", "data_source", "native_reward_fn_key", "rewards are chosen per data_source"),
    _m("data.train_batch_size", "rollout.prompts_per_cycle", "one verl step = one miniverl cycle"),
    _i("data.max_prompt_length", "verl stops on a longer prompt (truncation: error); no effect on the math"),
    _m("data.max_response_length", "rollout.max_new_tokens", "response budget"),
    _m("data.shuffle", "data.shuffle", "same"),
    _m("data.seed", "run.seed", "one seed for data order and sampling"),
    _e("data.truncation", "error", "native_truncation", "a truncated prompt would change the policy's input"),
    _e("data.filter_overlong_prompts", False, "native_filter_prompts", "miniverl never drops prompts"),
    _i("data.dataloader_num_workers", "data-loader processes only"),
    _r("actor_rollout_ref.model.path", "model", "bound by runtime_bindings.model (local dir, hub id@40-hex, builtin)"),
    _m("actor_rollout_ref.model.lora_rank", "models.student.lora.r", "same rank (0 is refused: lora_disabled)"),
    _m("actor_rollout_ref.model.lora_alpha", "models.student.lora.alpha", "same alpha"),
    _m("actor_rollout_ref.model.target_modules", "models.student.lora.target_modules", "a list of module names"),
    _r("actor_rollout_ref.model.enable_gradient_checkpointing", "-", "memory only"),
    _e(A + "strategy", "fsdp", "native_strategy", "verl's FSDP actor (the engine v1 emits)"),
    _s(A + "ppo_mini_batch_size", "data.train_batch_size", "grpo_mini_batches",
       "miniverl GRPO makes one optimizer update per cycle: one mini-batch of the whole step"),
    _r(A + "ppo_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only (token-mean over the step)"),
    _e(A + "ppo_epochs", 1, "grpo_ppo_epochs", "miniverl GRPO makes one pass over each rollout"),
    _i(A + "shuffle", "one mini-batch per step: its order has no effect"),
    _s(A + "data_loader_seed", "data.seed", "native_seeds_differ", "miniverl has one seed (run.seed)"),
    _s(A + "clip_ratio", A + "clip_ratio_low", "native_clip_ratio", "verl's symmetric default must agree with _low"),
    _m(A + "clip_ratio_low", "algorithm.grpo.clip_low", "same lower clip"),
    _m(A + "clip_ratio_high", "algorithm.grpo.clip_high", "same upper clip"),
    _e(A + "loss_agg_mode", "token-mean", "native_loss_agg_mode", "miniverl's loss is the token mean"),
    _e(A + "entropy_coeff", 0, "native_entropy_bonus", "miniverl's GRPO loss has no entropy bonus"),
    _m(A + "use_kl_loss", "algorithm.grpo.kl_mode", "on: KL in the loss (kl_mode loss)", to="kl_loss"),
    _m(A + "kl_loss_coef", "algorithm.grpo.kl_coef", "the KL coefficient (when use_kl_loss)", to="kl_coef"),
    _m(A + "kl_loss_type", "algorithm.grpo.kl_estimator", "k1/k2/low_var_kl (verl's k3 is refused)", to="kl_est"),
    _m(A + "optim.lr", "train.learning_rate", "same constant learning rate"),
    _m(A + "optim.weight_decay", "train.weight_decay", "same"),
    _m(A + "optim.betas", "train.adam_betas", "same"),
    _m(A + "optim.clip_grad", "train.max_grad_norm", "same global-norm clip"),
    _e(A + "optim.lr_warmup_steps", 0, "native_lr_warmup", "miniverl's learning rate is constant"),
    _e(A + "optim.lr_scheduler_type", "constant", "native_lr_schedule", "miniverl's learning rate is constant"),
    _m(A + "optim.override_optimizer_config.eps", "train.adam_eps", "AdamW eps"),
    _m(A + "fsdp_config.model_dtype", "models.dtype", "parameter precision", to="precision"),
    _s(A + "fsdp_config.dtype", R + "dtype", "native_dtypes_differ", "one precision for every role"),
    _r("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only"),
    _s("actor_rollout_ref.ref.fsdp_config.model_dtype", A + "fsdp_config.model_dtype", "native_dtypes_differ",
       "one precision for every role"),
    _s("actor_rollout_ref.ref.fsdp_config.dtype", R + "dtype", "native_dtypes_differ", "one precision"),
    _r(R + "name", "-", "vLLM/SGLang becomes miniverl's HF generate (same sampling parameters)"),
    _m(R + "n", "rollout.samples_per_prompt", "group size"),
    _m(R + "temperature", "rollout.temperature", "same"),
    _m(R + "top_p", "rollout.top_p", "same"),
    _m(R + "top_k", "rollout.top_k", "-1 (off) becomes miniverl's 0", to="top_k"),
    _m(R + "do_sample", "rollout.temperature", "must agree with the temperature (false: 0)", to="do_sample"),
    _m(R + "dtype", "models.dtype", "one precision for every role", to="dtype"),
    _s(R + "seed", "data.seed", "native_seeds_differ", "miniverl has one seed (run.seed)"),
    _r(R + "tensor_model_parallel_size", "-", "rollout sharding (one device here)"),
    _r(R + "gpu_memory_utilization", "-", "vLLM memory budget"),
    _r(R + "log_prob_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only"),
    _e("critic.enable", False, "critic_lora_value_head", "a native PPO critic: compiler v2's refusal applies"),
    _e("reward_model.enable", False, "native_reward_model_worker",
       "verl's reward_model worker is not miniverl's reward computation"),
    _r("reward.custom_reward_function.path", "-", "the bundle writes reward_fn.py calling miniverl's reward code"),
    _e("reward.custom_reward_function.name", "compute_score", "native_reward_function", "miniverl's entry"),
    _m("reward.custom_reward_function.reward_kwargs.miniverl_rewards", "algorithm.rewards",
       "the reward terms (name, weight, params) the reward function computes"),
    _e("reward.reward_manager.name", "naive", "native_reward_manager", "one call per response"),
    _m("algorithm.adv_estimator", "algorithm.name", "grpo; gae is PPO (refused like v2: critic_lora_value_head)",
       to="estimator"),
    _m("algorithm.norm_adv_by_std_in_grpo", "algorithm.grpo.norm_by_std", "same"),
    _m("algorithm.use_kl_in_reward", "algorithm.grpo.kl_mode", "on: in-reward KL (kl_mode reward)", to="kl_reward"),
    _m("algorithm.kl_penalty", "algorithm.grpo.kl_estimator", "the in-reward KL estimator", to="kl_est"),
    _e("algorithm.kl_ctrl.type", "fixed", "native_adaptive_kl", "miniverl's KL coefficient is fixed"),
    _m("algorithm.kl_ctrl.kl_coef", "algorithm.grpo.kl_coef", "the in-reward KL coefficient", to="kl_coef"),
    _i("trainer.project_name", "logging only"),
    _m("trainer.experiment_name", "run.name", "the experiment name becomes the run name"),
    _m("trainer.total_training_steps", "train.cycles", "one cycle per verl step"),
    _i("trainer.total_epochs", "an upper bound; total_training_steps decides"),
    _m("trainer.save_freq", "checkpoint.every_updates", "same cadence"),
    _m("trainer.max_actor_ckpt_to_keep", "checkpoint.keep_last", "same retention"),
    _e("trainer.test_freq", -1, "native_validation", "miniverl runs no validation during training"),
    _e("trainer.val_before_train", False, "native_validation", "miniverl runs no validation during training"),
    _i("trainer.logger", "logging only"),
    _r("trainer.device", "device", "bound by runtime_bindings.device"),
    _r("trainer.nnodes", "-", "one node"),
    _r("trainer.n_gpus_per_node", "-", "one device"),
    _r("trainer.default_local_dir", "-", "checkpoints go to the miniverl run directory"),
)  # fmt: skip

#: runtime bindings the user supplies (``--set KEY=VALUE`` or ``--bindings FILE``): never the native file
BINDINGS: dict[str, str] = {
    "model": "actor_rollout_ref.model.path: a local directory, a hub id@40-hex revision or a builtin name",
    "device": "auto, cpu or cuda (models.device)",
    "quantization": (
        "none or nf4 (models.student.quantization; nf4 is handed off on the full-precision base, "
        "rule nf4_not_carried_over)"
    ),
    "trajectory_batch_size": "auto or a number (train.trajectory_batch_size; micro-batching only)",
    "batch_size": "rollout generation batch (rollout.batch_size)",
}

#: native keys whose bundle value legitimately differs (the documented runtime keys of native-diff.json)
RUNTIME_KEYS = frozenset(r.key for r in RULES if r.action == "runtime") | {
    "data.train_files",
    "actor_rollout_ref.model.lora_adapter_path",
    "reward.custom_reward_function.reward_kwargs.miniverl_rewards",
}


#: native keys with no effect on the math (logging, bookkeeping): a different bundle value is ``ignored``
IGNORED_KEYS = frozenset(r.key for r in RULES if r.action == "ignore")


def rules_by_key() -> dict[str, ImportRule]:
    return {rule.key: rule for rule in RULES}


def import_rules_digest() -> str:
    """sha256 of the import table's canonical JSON (with the bindings it accepts)."""
    return sha256_json({"rules": [r.model_dump(mode="json") for r in RULES], "bindings": BINDINGS})


def render_markdown() -> str:
    """The import table as Markdown (the handoff README's copy is checked against this by a test)."""
    lines = ["| native verl key | action | miniverl field / binding / value | refusal | why |", "|---|---|---|---|---|"]
    for rule in RULES:
        target = rule.field or ""
        if rule.action == "expect":
            target = f"`{rule.value!r}`"
        elif target and target != "-":
            target = f"`{target}`" + (f" ({rule.to})" if rule.to else "")
        code = f"`{rule.code}`" if rule.code else ""
        lines.append(f"| `{rule.key}` | {rule.action} | {target} | {code} | {rule.reason} |")
    return "\n".join(lines) + "\n"
