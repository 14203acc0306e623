"""An :class:`ExperimentIR` -> a verl 0.9 Hydra config (``ppo_trainer`` layout).

The emitted YAML is an overlay: ``defaults: [ppo_trainer, _self_]`` with verl's own config
directory on the Hydra search path (``pkg://verl.trainer.config``), so verl supplies every
default and the bundle states only what the experiment decides. Paths are relative to the
bundle; ``launch.sh`` passes their locations on the command line at launch time.
"""

from __future__ import annotations

from typing import Any

import yaml

from miniverl.handoff.ir import ExperimentIR, GrpoIR, PpoIR

SEARCHPATH = "pkg://verl.trainer.config"
PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
ROLLOUT_DTYPE = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
MODEL_DIR = "model"
ADAPTER_DIR = "adapter"


def config_name(ir: ExperimentIR) -> str:
    """The YAML's name in ``config/`` (``miniverl_grpo`` or ``miniverl_ppo``)."""
    return "miniverl_ppo" if isinstance(ir.algorithm, PpoIR) else "miniverl_grpo"


def model_path(ir: ExperimentIR) -> str:
    """What ``actor_rollout_ref.model.path`` says in the YAML (launch.sh replaces it at launch)."""
    if ir.model.binding in ("hub", "builtin"):
        assert ir.model.model_id is not None
        return ir.model.model_id
    return MODEL_DIR


def emit_verl_config(ir: ExperimentIR) -> dict[str, Any]:
    """The verl config overlay as plain data (dict key order is the YAML's order)."""
    algo = ir.algorithm
    precision = PRECISION[ir.model.dtype]
    micro = ir.rollout.micro_batch_per_gpu
    fsdp = {"model_dtype": precision, "dtype": ROLLOUT_DTYPE[ir.model.dtype]}
    model: dict[str, Any] = {
        "path": model_path(ir),
        "lora_rank": ir.lora.rank,
        "lora_alpha": ir.lora.alpha,
        "target_modules": list(ir.lora.target_modules),
        "enable_gradient_checkpointing": ir.model.gradient_checkpointing,
        "use_liger": ir.model.use_liger,
    }
    if ir.lora.start_adapter == "bundle":
        model["lora_adapter_path"] = ADAPTER_DIR
    return {
        "hydra": {"searchpath": [SEARCHPATH]},
        "defaults": ["ppo_trainer", "_self_"],
        "data": {
            "train_files": ir.data.train_file,
            "val_files": ir.data.train_file,
            "prompt_key": "prompt",
            "reward_fn_key": "data_source",
            "train_batch_size": ir.rollout.prompts_per_step,
            "max_prompt_length": ir.data.max_prompt_length,
            "max_response_length": ir.rollout.max_response_length,
            "shuffle": ir.data.shuffle,
            "seed": ir.data.seed,
            "truncation": "error",
            "filter_overlong_prompts": False,
            "dataloader_num_workers": 0,
        },
        "actor_rollout_ref": {
            "model": model,
            "actor": {
                # FSDP2: on one GPU verl 0.9.1's FSDP1 runs NO_SHARD, and its LoRA sync to vLLM gathers nothing
                # there (each LoRA linear is its own FSDP unit) and then fails (NO_SHARD cannot offload to CPU).
                "strategy": "fsdp2",
                "ppo_mini_batch_size": algo.mini_batch_prompts,
                "ppo_micro_batch_size_per_gpu": micro,
                "ppo_epochs": algo.ppo_epochs,
                "shuffle": algo.shuffle_mini_batches,
                "data_loader_seed": ir.schedule.seed,
                "clip_ratio": algo.clip_ratio_low,
                "clip_ratio_low": algo.clip_ratio_low,
                "clip_ratio_high": algo.clip_ratio_high,
                "loss_agg_mode": algo.loss_agg_mode,
                "entropy_coeff": 0,
                "use_kl_loss": algo.use_kl_loss,
                "kl_loss_coef": algo.kl_loss_coef,
                "kl_loss_type": algo.kl_loss_type,
                "optim": {
                    "lr": ir.optim.lr,
                    "weight_decay": ir.optim.weight_decay,
                    "betas": list(ir.optim.betas),
                    "clip_grad": ir.optim.clip_grad,
                    "lr_warmup_steps": 0,
                    "lr_scheduler_type": "constant",
                    "override_optimizer_config": {"eps": ir.optim.eps},
                },
                "fsdp_config": dict(fsdp),
            },
            "ref": {"log_prob_micro_batch_size_per_gpu": micro, "fsdp_config": dict(fsdp)},
            "rollout": {
                "name": ir.rollout.engine,
                "n": ir.rollout.samples_per_prompt,
                "temperature": ir.rollout.temperature,
                "top_p": ir.rollout.top_p,
                "top_k": ir.rollout.top_k,
                "do_sample": ir.rollout.do_sample,
                "dtype": ROLLOUT_DTYPE[ir.model.dtype],
                "seed": ir.schedule.seed,
                "tensor_model_parallel_size": ir.runtime.tensor_model_parallel_size,
                "log_prob_micro_batch_size_per_gpu": micro,
                # verl's LoRA sync sends vLLM the adapter only: the base weights must come from the checkpoint
                # (verl's docs: required for LoRA). Its default, dummy, left vLLM's LoRA empty on an H100.
                # layered_summon gathers the adapter layer by layer, as verl's own LoRA example does.
                "load_format": "safetensors",
                "layered_summon": True,
            },
        },
        "critic": _critic_section(ir, algo, fsdp) if isinstance(algo, PpoIR) else {"enable": False},
        "reward_model": {"enable": False},
        "reward": {
            "custom_reward_function": {"path": ir.reward.function_file, "name": ir.reward.function_name},
            "reward_manager": {"name": "naive"},
        },
        "algorithm": _algorithm_section(algo),
        "trainer": {
            "project_name": "miniverl-handoff",
            "experiment_name": ir.schedule.experiment_name,
            "total_training_steps": ir.schedule.total_training_steps,
            "total_epochs": 1_000_000,
            "save_freq": ir.schedule.save_freq,
            "max_actor_ckpt_to_keep": ir.schedule.max_ckpt_to_keep,
            "test_freq": -1,
            "val_before_train": False,
            "logger": ["console"],
            "device": ir.runtime.device,
            "nnodes": ir.runtime.nnodes,
            "n_gpus_per_node": ir.runtime.n_gpus_per_node,
            "default_local_dir": "checkpoints",
            **({"max_critic_ckpt_to_keep": ir.schedule.max_ckpt_to_keep} if isinstance(algo, PpoIR) else {}),
        },
    }


def _critic_section(ir: ExperimentIR, algo: PpoIR, fsdp: dict[str, str]) -> dict[str, Any]:
    critic = algo.critic
    micro = ir.rollout.micro_batch_per_gpu
    return {
        "enable": True,
        "strategy": "fsdp2",
        "model": {
            "path": model_path(ir),
            "lora_rank": critic.lora_rank,
            "lora_alpha": critic.lora_alpha,
            "target_modules": list(critic.target_modules),
            "lora_adapter_path": critic.adapter_dir,
            "enable_gradient_checkpointing": ir.model.gradient_checkpointing,
        },
        "ppo_mini_batch_size": critic.mini_batch_prompts,
        "ppo_micro_batch_size_per_gpu": micro,
        "forward_micro_batch_size_per_gpu": micro,
        "ppo_epochs": critic.ppo_epochs,
        "shuffle": algo.shuffle_mini_batches,
        "data_loader_seed": ir.schedule.seed,
        "cliprange_value": algo.cliprange_value,
        "loss_agg_mode": algo.loss_agg_mode,
        "grad_clip": critic.clip_grad,
        "optim": {
            "lr": critic.lr,
            "weight_decay": ir.optim.weight_decay,
            "betas": list(ir.optim.betas),
            "clip_grad": critic.clip_grad,
            "lr_warmup_steps": 0,
            "lr_scheduler_type": "constant",
            "override_optimizer_config": {"eps": ir.optim.eps},
        },
        "fsdp": {"model_dtype": fsdp["model_dtype"]},
    }


def _algorithm_section(algo: GrpoIR | PpoIR) -> dict[str, Any]:
    section: dict[str, Any] = {"adv_estimator": algo.kind}
    if isinstance(algo, PpoIR):
        section |= {"gamma": algo.gamma, "lam": algo.lam}
    else:
        section["norm_adv_by_std_in_grpo"] = algo.norm_adv_by_std
    section["use_kl_in_reward"] = algo.use_kl_in_reward
    if algo.use_kl_in_reward:  # a fixed controller: the coefficient never adapts
        section["kl_penalty"] = algo.kl_penalty
        section["kl_ctrl"] = {"type": "fixed", "kl_coef": algo.kl_reward_coef}
    return section


def render_yaml(config: dict[str, Any], *, header: str) -> str:
    """Deterministic YAML (key order as built, no aliases) after a comment header."""

    class _NoAliases(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:
            return True

    body = yaml.dump(config, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, allow_unicode=True)
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comments + body
