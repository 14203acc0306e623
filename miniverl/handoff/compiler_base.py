"""What every verl compiler shares: the policy-side refusals, the KL to the reference, and the IR around an
algorithm section (model binding, LoRA, data, rollout, optimizer, schedule, rewards, deviations).

:mod:`miniverl.handoff.compiler` (v1, GRPO) and :mod:`miniverl.handoff.compiler_v2` (PPO) build on it; it imports
neither of them.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from miniverl.canonical import sha256_json
from miniverl.config.schema import (
    IMMUTABLE_REVISION,
    REWARD_MODEL_TERM,
    GrpoSection,
    MiniverlConfig,
    ModelSpec,
    PpoSection,
)
from miniverl.handoff.ir import (
    CompilerId,
    DataIR,
    ExperimentIR,
    GrpoIR,
    LoraIR,
    ModelBindingIR,
    OptimIR,
    PpoIR,
    QuantizationIR,
    RewardIR,
    RewardModelIR,
    RewardTermIR,
    RolloutIR,
    ScheduleIR,
    SourceIR,
)
from miniverl.handoff.rules import note, refuse
from miniverl.records import PlanRecord

#: Prompt budget (tokens) written to data.max_prompt_length; verl fails loudly on longer prompts
#: (data.truncation: error), it never truncates silently.
MAX_PROMPT_LENGTH = 1024
#: Rewards whose value depends on the response token count (re-counted from the decoded text in verl).
TOKEN_COUNT_REWARDS = frozenset({"target_length"})
TRAIN_FILE = "data/train.parquet"


def build_ir(
    plan: PlanRecord,
    config: MiniverlConfig,
    compiler: CompilerId,
    algorithm: GrpoIR | PpoIR,
    *,
    start_adapter: bool = False,
) -> ExperimentIR:
    """The IR's sections that do not depend on the algorithm, around ``algorithm``."""
    models, rollout, train = config.models, config.rollout, config.train
    lora = models.student.lora
    assert lora is not None  # ModelsSection fills it in
    # verl splits each mini-batch (the actor's, and the critic's) evenly into micro-batches
    span_prompts = algorithm.mini_batch_prompts
    if isinstance(algorithm, PpoIR):
        span_prompts = math.gcd(span_prompts, algorithm.critic.mini_batch_prompts)
    span = span_prompts * rollout.samples_per_prompt
    wanted = span if train.trajectory_batch_size == "auto" else min(int(train.trajectory_batch_size), span)
    micro = max(d for d in range(1, wanted + 1) if span % d == 0)
    terms = tuple(
        RewardTermIR(name=t.name, weight=t.weight, params=dict(t.params))
        for t in config.algorithm.rewards
        if t.name != REWARD_MODEL_TERM
    )
    assert train.max_grad_norm is not None  # refused above otherwise
    return ExperimentIR(
        compiler=compiler,
        source=SourceIR(
            config_digest=plan.config_digest, data_sha256=plan.data.sha256, miniverl_version=plan.miniverl_version
        ),
        model=_model_binding(plan, config),
        lora=LoraIR(
            rank=lora.r,
            alpha=int(lora.alpha),
            target_modules=tuple(lora.target_modules),
            start_adapter="bundle" if start_adapter else "fresh",
        ),
        data=DataIR(
            train_file=TRAIN_FILE,
            rows=plan.data.rows,
            source_sha256=plan.data.sha256,
            shuffle=config.data.shuffle,
            seed=config.run.seed,
            max_prompt_length=MAX_PROMPT_LENGTH,
        ),
        rollout=RolloutIR(
            prompts_per_step=rollout.prompts_per_cycle,
            samples_per_prompt=rollout.samples_per_prompt,
            max_response_length=rollout.max_new_tokens,
            do_sample=rollout.temperature > 0,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k if rollout.top_k > 0 else -1,
            micro_batch_per_gpu=micro,
        ),
        algorithm=algorithm,
        optim=OptimIR(
            lr=train.learning_rate,
            weight_decay=train.weight_decay,
            betas=(float(train.adam_betas[0]), float(train.adam_betas[1])),
            eps=train.adam_eps,
            clip_grad=train.max_grad_norm,
        ),
        schedule=ScheduleIR(
            total_training_steps=train.cycles,
            save_freq=config.checkpoint.every_updates,
            max_ckpt_to_keep=config.checkpoint.keep_last,
            experiment_name=config.run.name,
            seed=config.run.seed,
        ),
        reward=RewardIR(
            terms=terms,
            needs_response_token_count=any(t.name in TOKEN_COUNT_REWARDS or ":" in t.name for t in terms),
            reward_model=_reward_model_ir(plan, config),
        ),
        deviations=_deviations(config, compiler),
    )


def common_refusals(config: MiniverlConfig, compiler: str) -> None:
    """The refusals of the policy side that every compiler shares (model, LoRA, chat template, clip)."""
    models, student = config.models, config.models.student
    if models.runtime == "shared_backbone":
        raise refuse("shared_backbone_adapters", "models.runtime: shared_backbone", compiler=compiler)
    if student.source == "gguf":
        raise refuse("gguf_weights", f"models.student.path: {student.path}", compiler=compiler)
    if student.source == "hub" and not IMMUTABLE_REVISION.match(student.revision or ""):
        raise refuse("mutable_revision", f"revision {student.revision!r}", compiler=compiler)
    lora = student.lora
    if lora is None or not lora.enabled:
        raise refuse("lora_disabled", compiler=compiler)
    if float(lora.alpha) != int(lora.alpha):
        raise refuse("lora_alpha_not_integer", f"alpha {lora.alpha}", compiler=compiler)
    if lora.dropout != 0:
        raise refuse("lora_dropout", f"dropout {lora.dropout}", compiler=compiler)
    if not config.rollout.use_chat_template:
        raise refuse("no_chat_template", compiler=compiler)
    if config.train.max_grad_norm is None:
        raise refuse("no_grad_clip", compiler=compiler)
    if config.algorithm.old_logp == "rollout":
        raise refuse("old_logp_from_rollout", compiler=compiler)
    if models.reward is not None and models.reward.source == "local":
        raise refuse("reward_model_local", f"models.reward.path: {models.reward.path}", compiler=compiler)


def kl_refusals(config: MiniverlConfig, section: GrpoSection | PpoSection, compiler: str) -> None:
    if section.kl_coef > 0:
        if section.kl_estimator == "k3":
            raise refuse("kl_k3_clamped", f"kl_coef {section.kl_coef}, kl_estimator k3", compiler=compiler)
        if not _reference_is_actor_base(config):
            raise refuse("reference_not_actor_base", _describe(config.models.reference), compiler=compiler)


def kl_fields(g: GrpoSection | PpoSection) -> dict[str, Any]:
    """The KL to the reference as verl's KL loss (``kl_mode: loss``) or in-reward KL (``reward``)."""
    if g.kl_coef == 0:
        return {"use_kl_loss": False, "kl_loss_coef": 0.0}
    kind = g.kl_estimator
    assert kind != "k3"  # refused above
    if g.kl_mode == "loss":
        return {"use_kl_loss": True, "kl_loss_coef": g.kl_coef, "kl_loss_type": kind}
    return {"use_kl_loss": False, "kl_loss_coef": 0.0, "use_kl_in_reward": True, "kl_reward_coef": g.kl_coef,
            "kl_penalty": kind}  # fmt: skip


def _reference_is_actor_base(config: MiniverlConfig) -> bool:
    """verl's reference for a LoRA actor is the actor's base with the adapter disabled (ref_in_actor)."""
    ref, student = config.models.reference, config.models.student
    if ref is None or ref.adapter is not None or ref.privileged_context is not None or ref.quantization != "none":
        return False
    if ref.source == "student":
        return True
    same = (ref.source, ref.model_id, ref.revision, ref.path) == (
        student.source,
        student.model_id,
        student.revision,
        student.path,
    )
    return same


def _describe(spec: ModelSpec | None) -> str:
    if spec is None:
        return "no models.reference"
    parts = [f"source {spec.source}"]
    if spec.model_id or spec.path:
        parts.append(str(spec.model_id or spec.path))
    if spec.adapter is not None:
        parts.append(f"adapter {spec.adapter.path}")
    if spec.privileged_context is not None:
        parts.append("privileged_context")
    if spec.quantization != "none":
        parts.append(spec.quantization)
    return ", ".join(parts)


def _model_binding(plan: PlanRecord, config: MiniverlConfig) -> ModelBindingIR:
    student = config.models.student
    binding: Literal["hub", "builtin", "bundle"] = (
        "hub" if student.source == "hub" else "builtin" if student.source == "builtin" else "bundle"
    )
    return ModelBindingIR(
        binding=binding,
        model_id=student.model_id if binding != "bundle" else None,
        revision=student.revision if binding == "hub" else None,
        identity_digest=sha256_json(plan.models.get("student", {})),
        dtype=config.models.dtype,
        gradient_checkpointing=config.train.activation_checkpointing != 0,  # auto may checkpoint
        use_liger=config.train.fused_kernels == "liger",
        quantization=QuantizationIR.of(student.quantization),
    )


def _reward_model_ir(plan: PlanRecord, config: MiniverlConfig) -> RewardModelIR | None:
    spec = config.models.reward
    if spec is None:
        return None
    weight = next(t.weight for t in config.algorithm.rewards if t.name == REWARD_MODEL_TERM)
    kept = spec.model_dump(mode="json", exclude={"placement", "batch_size", "path"})
    return RewardModelIR(spec=kept, identity=dict(plan.models["reward"]), weight=weight)


def _deviations(config: MiniverlConfig, compiler: CompilerId) -> tuple[str, ...]:
    out = [
        "engine_numerics: FSDP actor and vLLM rollout kernels (bitwise results differ from miniverl's HF eager path)"
    ]
    if config.models.student.quantization == "nf4":
        out.append(note("nf4_not_carried_over", compiler))
    if config.models.reward is not None:
        out.append(
            "reward_model_unbatched: verl calls the reward function once per response, so the reward "
            "model scores each text alone (no padding), not in batches of models.reward.batch_size"
        )
    if any(t.name in TOKEN_COUNT_REWARDS or ":" in t.name for t in config.algorithm.rewards):
        out.append(
            "response_token_count_retokenized: verl's reward function gets decoded text; the token count "
            "is re-counted with the actor's tokenizer (EOS excluded, as in miniverl)"
        )
    return tuple(out)
