"""The import rules of compiler ``verl-rl-v0.9-single-gpu-v4``: native verl 0.9 keys -> miniverl fields.

The table is the inverse of the exports of compiler v1 (GRPO, ``rules_v1.json``) and v2 (PPO with a
critic, ``rules_v2.json``): each dotted key of a verl 0.9 ``ppo_trainer``-layout YAML is one of

- ``map``: its value becomes ``field`` of the miniverl config (``to`` names a conversion);
- ``same``: it must equal the value of ``field``'s own native key (one seed, one dtype, ...);
- ``expect``: it must equal ``value`` or one of ``also`` (the values miniverl computes the same way);
  otherwise the import stops with ``code``;
- ``runtime``: a placement or engine choice (device, micro-batches, rollout engine, paths); its
  native value is recorded but miniverl uses the user's ``runtime_bindings``;
- ``ignore``: logging, validation and bookkeeping with no effect on the math.

A key not in the table is refused (``unknown_native_key``); a ``map`` key that is absent is refused
(``native_key_missing``: verl's default would apply silently), except the few whose verl default is an
interpolation miniverl models the same way (the critic's epochs and mini-batch size default to the actor's).
A ``same`` rule with ``verl_default`` compares verl 0.9.1's default when the key is absent. A rule with
``only`` applies to one estimator (``grpo`` or ``ppo``); in a file of the other one verl never reads the
key, and it is recorded as unused. ``{algo}`` in a field is the file's algorithm section. Facts about
verl 0.9.1's config come from its ``ppo_trainer`` layout; no verl code is used.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from miniverl.canonical import sha256_json

Action = Literal["map", "same", "expect", "runtime", "ignore"]
Estimator = Literal["grpo", "ppo"]
A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
C = "critic."


class ImportRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    action: Action
    field: str | None = None
    to: str | None = None
    value: Any = None
    #: further values an ``expect`` rule accepts (the same math by another engine: verl's FSDP1 or FSDP2)
    also: tuple[Any, ...] = ()
    code: str | None = None
    reason: str
    #: the estimator whose run reads this key (``grpo`` or ``ppo``); in a file of the other one the key has
    #: no effect in verl (verl's GRPO has no critic and no GAE; its GAE ignores the GRPO normalization)
    only: Estimator | None = None
    #: verl 0.9.1's own default: compared when the key is absent (``same`` rules: verl would apply it), and what
    #: a bundle that leaves the key out gets from verl (``expect`` rules)
    verl_default: Any = None

    def target(self, estimator: Estimator) -> str:
        """The miniverl field, with ``{algo}`` resolved to the file's algorithm section."""
        return str(self.field).replace("{algo}", estimator)


def _m(
    key: str, field: str, reason: str, to: str | None = None, only: Estimator | None = None, default: Any = None
) -> ImportRule:
    return ImportRule(key=key, action="map", field=field, to=to, reason=reason, only=only, verl_default=default)


def _e(
    key: str, value: Any, code: str, reason: str, only: Estimator | None = None, also: tuple[Any, ...] = ()
) -> ImportRule:
    return ImportRule(key=key, action="expect", value=value, also=also, code=code, reason=reason, only=only)


def _s(key: str, other: str, code: str, reason: str, only: Estimator | None = None, default: Any = None) -> ImportRule:
    return ImportRule(key=key, action="same", field=other, code=code, reason=reason, only=only, verl_default=default)


def _r(key: str, binding: str, reason: str, only: Estimator | None = None) -> ImportRule:
    return ImportRule(key=key, action="runtime", field=binding, reason=reason, only=only)


def _i(key: str, reason: str, only: Estimator | None = None) -> ImportRule:
    return ImportRule(key=key, action="ignore", reason=reason, only=only)


_ONE_SEED = "miniverl has one seed (run.seed)"
_ONE_DTYPE = "one precision for every role"
_CONSTANT_LR = "miniverl's learning rate is constant"
_CRITIC_OPTIM = "the critic's AdamW takes the actor's weight decay, betas and eps (train.*) in miniverl"

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
    _m("actor_rollout_ref.model.use_liger", "train.fused_kernels", "liger-kernel (true: liger)", to="liger_switch",
       default=False),
    _r("actor_rollout_ref.model.use_remove_padding", "-", "padding removal: the same tokens, packed (kernel choice)"),
    _e(A + "strategy", "fsdp2", "native_strategy", "verl's FSDP actor: FSDP2 (what bundles emit) or FSDP1",
       also=("fsdp",)),
    _m(A + "ppo_mini_batch_size", "algorithm.{algo}.mini_batches",
       "mini-batches per pass = data.train_batch_size / ppo_mini_batch_size (whole prompt groups; a size that does "
       "not divide the step is refused: mini_batch_splits_groups)", to="mini_batches"),
    _r(A + "ppo_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only (token mean)"),
    _m(A + "ppo_epochs", "algorithm.{algo}.ppo_epochs", "the same passes over each step's rollouts"),
    _m(A + "shuffle", "algorithm.{algo}.shuffle_mini_batches", "mini-batch order reshuffled per pass (seeded)"),
    _s(A + "data_loader_seed", "data.seed", "native_seeds_differ", _ONE_SEED),
    _s(A + "clip_ratio", A + "clip_ratio_low", "native_clip_ratio", "verl's symmetric default must agree with _low"),
    _m(A + "clip_ratio_low", "algorithm.{algo}.clip_low", "same lower clip"),
    _m(A + "clip_ratio_high", "algorithm.{algo}.clip_high", "same upper clip"),
    _e(A + "loss_agg_mode", "token-mean", "native_loss_agg_mode", "miniverl's loss is the token mean"),
    _e(A + "entropy_coeff", 0, "native_entropy_bonus", "miniverl's policy loss has no entropy bonus"),
    _m(A + "use_kl_loss", "algorithm.{algo}.kl_mode", "on: KL in the loss (kl_mode loss)", to="kl_loss"),
    _m(A + "kl_loss_coef", "algorithm.{algo}.kl_coef", "the KL coefficient (when use_kl_loss)", to="kl_coef"),
    _m(A + "kl_loss_type", "algorithm.{algo}.kl_estimator",
       "k1, k2, low_var_kl; verl's kl, mse and k3 (its clamped low_var_kl) are those formulas", to="kl_est"),
    _m(A + "optim.lr", "train.learning_rate", "same constant learning rate"),
    _m(A + "optim.weight_decay", "train.weight_decay", "same"),
    _m(A + "optim.betas", "train.adam_betas", "same"),
    _m(A + "optim.clip_grad", "train.max_grad_norm", "same global-norm clip"),
    _e(A + "optim.lr_warmup_steps", 0, "native_lr_warmup", _CONSTANT_LR),
    _e(A + "optim.lr_scheduler_type", "constant", "native_lr_schedule", _CONSTANT_LR),
    _m(A + "optim.override_optimizer_config.eps", "train.adam_eps", "AdamW eps"),
    _m(A + "fsdp_config.model_dtype", "models.dtype", "parameter precision", to="precision"),
    _s(A + "fsdp_config.dtype", R + "dtype", "native_dtypes_differ", _ONE_DTYPE),
    _r(A + "fsdp_config.param_offload", "-", "FSDP CPU offload of parameters: memory placement only"),
    _r(A + "fsdp_config.optimizer_offload", "-", "FSDP CPU offload of optimizer state: memory placement only"),
    _r("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only"),
    _s("actor_rollout_ref.ref.fsdp_config.model_dtype", A + "fsdp_config.model_dtype", "native_dtypes_differ",
       _ONE_DTYPE),
    _s("actor_rollout_ref.ref.fsdp_config.dtype", R + "dtype", "native_dtypes_differ", "one precision"),
    _r("actor_rollout_ref.ref.fsdp_config.param_offload", "-", "FSDP CPU offload of parameters: memory placement only"),
    _r(R + "name", "-", "vLLM/SGLang becomes miniverl's HF generate (same sampling parameters)"),
    _m(R + "n", "rollout.samples_per_prompt", "group size"),
    _m(R + "temperature", "rollout.temperature", "same"),
    _m(R + "top_p", "rollout.top_p", "same"),
    _m(R + "top_k", "rollout.top_k", "-1 (off) becomes miniverl's 0", to="top_k"),
    _m(R + "do_sample", "rollout.temperature", "must agree with the temperature (false: 0)", to="do_sample"),
    _m(R + "dtype", "models.dtype", _ONE_DTYPE, to="dtype"),
    _s(R + "seed", "data.seed", "native_seeds_differ", _ONE_SEED),
    _r(R + "tensor_model_parallel_size", "-", "rollout sharding (one device here)"),
    _r(R + "gpu_memory_utilization", "-", "vLLM memory budget"),
    _r(R + "load_format", "-", "where vLLM's base weights come from (a LoRA run needs the checkpoint: safetensors)"),
    _r(R + "layered_summon", "-", "how the adapter is gathered for vLLM (layer by layer: memory only)"),
    _r(R + "log_prob_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only"),
    _m(C + "enable", "models.critic", "true with adv_estimator gae (PPO's critic), false with grpo; absent: verl "
       "decides from the estimator the same way", to="critic_enable"),
    _e(C + "strategy", "fsdp2", "native_strategy", "verl's FSDP critic: FSDP2 (what bundles emit) or FSDP1",
       only="ppo", also=("fsdp",)),
    _s(C + "model.path", "actor_rollout_ref.model.path", "critic_other_base",
       "miniverl's critic starts from the actor's base (models.critic source student); the path is bound at "
       "runtime with the actor's", only="ppo", default="~/models/deepseek-llm-7b-chat"),
    _m(C + "model.lora_rank", "models.critic.lora.r", "same critic LoRA rank (0, a full-parameter critic, is "
       "refused: critic_full_parameter)", to="critic_rank", only="ppo"),
    _m(C + "model.lora_alpha", "models.critic.lora.alpha", "same critic LoRA alpha", only="ppo"),
    _m(C + "model.target_modules", "models.critic.lora.target_modules", "a list of module names", only="ppo"),
    _r(C + "model.enable_gradient_checkpointing", "-", "memory only", only="ppo"),
    _r(C + "model.use_remove_padding", "-", "padding removal: the same tokens, packed (kernel choice)", only="ppo"),
    _m(C + "ppo_mini_batch_size", "algorithm.ppo.critic_mini_batches", "critic mini-batches per pass = "
       "data.train_batch_size / critic.ppo_mini_batch_size (absent: verl takes the actor's, as miniverl's None)",
       to="critic_mini_batches", only="ppo"),
    _r(C + "ppo_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only", only="ppo"),
    _r(C + "forward_micro_batch_size_per_gpu", "trajectory_batch_size", "micro-batching only", only="ppo"),
    _m(C + "ppo_epochs", "algorithm.ppo.critic_ppo_epochs", "the critic's passes over each step's rollouts (absent: "
       "verl takes the actor's, as miniverl's None)", to="critic_epochs", only="ppo"),
    _s(C + "shuffle", A + "shuffle", "native_critic_shuffle", "miniverl orders the actor's and the critic's "
       "mini-batches by one switch (algorithm.ppo.shuffle_mini_batches); absent: verl takes the actor's", only="ppo"),
    _s(C + "data_loader_seed", "data.seed", "native_seeds_differ", _ONE_SEED, only="ppo"),
    _m(C + "cliprange_value", "algorithm.ppo.value_clip", "the same clipped value loss", only="ppo"),
    _e(C + "loss_agg_mode", "token-mean", "native_loss_agg_mode", "miniverl's value loss is the token mean",
       only="ppo"),
    _i(C + "grad_clip", "read by no verl 0.9.1 worker: the critic's engine clips with critic.optim.clip_grad",
       only="ppo"),
    _m(C + "optim.lr", "algorithm.ppo.critic_learning_rate", "same critic learning rate", only="ppo"),
    _m(C + "optim.clip_grad", "algorithm.ppo.critic_max_grad_norm", "same global-norm clip of the critic",
       only="ppo"),
    _s(C + "optim.weight_decay", A + "optim.weight_decay", "native_critic_optim", _CRITIC_OPTIM, only="ppo",
       default=0.01),
    _s(C + "optim.betas", A + "optim.betas", "native_critic_optim", _CRITIC_OPTIM, only="ppo", default=[0.9, 0.999]),
    _s(C + "optim.override_optimizer_config.eps", A + "optim.override_optimizer_config.eps", "native_critic_optim",
       _CRITIC_OPTIM + " (absent: torch's AdamW eps 1e-8)", only="ppo", default=1e-8),
    _e(C + "optim.lr_warmup_steps", 0, "native_lr_warmup", _CONSTANT_LR, only="ppo"),
    _e(C + "optim.lr_scheduler_type", "constant", "native_lr_schedule", _CONSTANT_LR, only="ppo"),
    _s(C + "fsdp.model_dtype", A + "fsdp_config.model_dtype", "native_dtypes_differ", _ONE_DTYPE, only="ppo",
       default="fp32"),
    _s(C + "fsdp.dtype", R + "dtype", "native_dtypes_differ", _ONE_DTYPE, only="ppo"),
    _r(C + "fsdp.param_offload", "-", "FSDP CPU offload of parameters: memory placement only", only="ppo"),
    _r(C + "fsdp.optimizer_offload", "-", "FSDP CPU offload of optimizer state: memory placement only", only="ppo"),
    _e("reward_model.enable", False, "native_reward_model_worker",
       "verl's reward_model worker is not miniverl's reward computation"),
    _r("reward.custom_reward_function.path", "-", "the bundle writes reward_fn.py calling miniverl's reward code"),
    _e("reward.custom_reward_function.name", "compute_score", "native_reward_function", "miniverl's entry"),
    _m("reward.custom_reward_function.reward_kwargs.miniverl_rewards", "algorithm.rewards",
       "the reward terms (name, weight, params) the reward function computes"),
    _e("reward.reward_manager.name", "naive", "native_reward_manager", "one call per response"),
    _m("algorithm.adv_estimator", "algorithm.name", "grpo: GRPO; gae: PPO with a critic (others are refused: "
       "native_adv_estimator)", to="estimator"),
    _m("algorithm.norm_adv_by_std_in_grpo", "algorithm.grpo.norm_by_std", "same", only="grpo"),
    _m("algorithm.gamma", "algorithm.ppo.gamma", "same GAE discount", only="ppo"),
    _m("algorithm.lam", "algorithm.ppo.lam", "same GAE lambda (verl whitens GAE advantages, as miniverl's "
       "whiten_advantages true)", only="ppo"),
    _m("algorithm.use_kl_in_reward", "algorithm.{algo}.kl_mode", "on: in-reward KL (kl_mode reward)", to="kl_reward"),
    _m("algorithm.kl_penalty", "algorithm.{algo}.kl_estimator", "the in-reward KL estimator (names as kl_loss_type)",
       to="kl_est"),
    _e("algorithm.kl_ctrl.type", "fixed", "native_adaptive_kl", "miniverl's KL coefficient is fixed"),
    _m("algorithm.kl_ctrl.kl_coef", "algorithm.{algo}.kl_coef", "the in-reward KL coefficient", to="kl_coef"),
    _i("trainer.project_name", "logging only"),
    _m("trainer.experiment_name", "run.name", "the experiment name becomes the run name"),
    _m("trainer.total_training_steps", "train.cycles", "one cycle per verl step"),
    _i("trainer.total_epochs", "an upper bound; total_training_steps decides"),
    _m("trainer.save_freq", "checkpoint.every_updates", "same cadence"),
    _m("trainer.max_actor_ckpt_to_keep", "checkpoint.keep_last", "same retention"),
    _s("trainer.max_critic_ckpt_to_keep", "trainer.max_actor_ckpt_to_keep", "native_checkpoint_retention",
       "miniverl keeps the actor and the critic in one checkpoint (checkpoint.keep_last)", only="ppo"),
    ImportRule(key="trainer.critic_warmup", action="expect", value=0, code="native_critic_warmup", verl_default=0,
               reason="miniverl updates the actor from the first step; verl's critic warmup skips the actor's "
               "update for that many steps"),
    _e("trainer.test_freq", -1, "native_validation", "miniverl runs no validation during training"),
    _e("trainer.val_before_train", False, "native_validation", "miniverl runs no validation during training"),
    _i("trainer.logger", "logging only"),
    _r("trainer.device", "device", "bound by runtime_bindings.device"),
    _e("trainer.nnodes", 1, "native_multi_node", "one node: the bundle's launch.sh starts verl on the local Ray "
       "of one machine (its GPUs: trainer.n_gpus_per_node); a layout over several nodes needs a Ray cluster the "
       "one-device plan and its bundle do not describe"),
    _r("trainer.n_gpus_per_node", "-", "one device here (verl's batch sizes are global: the same mini-batches on "
       "any number of GPUs of one node; launch.sh takes trainer.n_gpus_per_node=N)"),
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
    "critic.model.path",
    "critic.model.lora_adapter_path",
    "reward.custom_reward_function.reward_kwargs.miniverl_rewards",
}


#: critic keys whose verl 0.9.1 default interpolates the actor's key (``${oc.select:actor_rollout_ref.actor...}``)
INTERPOLATED: dict[str, str] = {
    C + "ppo_epochs": A + "ppo_epochs",
    C + "ppo_mini_batch_size": A + "ppo_mini_batch_size",
    C + "shuffle": A + "shuffle",
    C + "loss_agg_mode": A + "loss_agg_mode",
}

#: keys read only while a KL switch is on: switch -> keys (off in the native file and in the bundle: no effect)
KL_GATED: dict[str, tuple[str, ...]] = {
    "algorithm.use_kl_in_reward": ("algorithm.kl_penalty", "algorithm.kl_ctrl.type", "algorithm.kl_ctrl.kl_coef"),
    A + "use_kl_loss": (A + "kl_loss_coef", A + "kl_loss_type"),
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
    lines = [
        "| native verl key | for | action | miniverl field / binding / value | refusal | why |",
        "|---|---|---|---|---|---|",
    ]
    for rule in RULES:
        target = rule.field or ""
        if rule.action == "expect":
            target = " or ".join(f"`{value!r}`" for value in (rule.value, *rule.also))
        elif target and target != "-":
            target = f"`{target}`" + (f" ({rule.to})" if rule.to else "")
        if rule.verl_default is not None:
            target += f"; absent: verl's `{rule.verl_default!r}`"
        code = f"`{rule.code}`" if rule.code else ""
        only = {"grpo": "GRPO", "ppo": "PPO"}.get(str(rule.only), "both")
        lines.append(f"| `{rule.key}` | {only} | {rule.action} | {target} | {code} | {rule.reason} |")
    return "\n".join(lines) + "\n"
