"""The ``algorithm`` section: which algorithm trains, with its rewards and each algorithm's own settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from miniverl.config.fields import KlEstimator, KlMode, Seed, Strict


class RewardTerm(Strict):
    name: str = Field(
        description="a registered reward (miniverl rewards list), a 'pkg.mod:fn' plug-in, or reward_model "
        "(scored by models.reward)",
    )
    weight: float = Field(default=1.0, description="the term's weight in the trajectory's score (finite)")
    params: dict[str, float | int | str | bool] = Field(
        default_factory=dict,
        description="fixed keyword arguments of the reward function, checked against its signature",
    )


class GrpoSection(Strict):
    """GRPO's loss and its passes over one rollout (verl's ``ppo_epochs`` and ``ppo_mini_batch_size``).

    ``ppo_epochs`` passes over the cycle's trajectories, each split into ``mini_batches`` mini-batches of
    whole prompt groups (verl's ``train_batch_size / ppo_mini_batch_size``), one optimizer step each; the
    old log-probs are computed once before the first pass, so later steps see a ratio != 1 and the clip
    acts. ``train.gradient_accumulation_steps`` is the trajectories of one mini-batch.
    """

    ppo_epochs: Annotated[int, Field(ge=1)] = Field(
        default=1, description="passes over each cycle's trajectories (verl's ppo_epochs)"
    )
    mini_batches: Annotated[int, Field(ge=1)] = Field(
        default=1,
        description="mini-batches of whole prompt groups per pass, one optimizer step each; must divide "
        "rollout.prompts_per_cycle",
    )
    shuffle_mini_batches: bool = Field(
        default=True,
        description="split each pass into mini-batches in an order shuffled from (run.seed, update, pass), so a "
        "resume replays it; false: rollout order",
    )
    clip_low: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.2, description="the importance ratio's lower clip bound is 1 - clip_low"
    )
    clip_high: Annotated[float, Field(ge=0)] = Field(
        default=0.2,
        description="the importance ratio's upper clip bound is 1 + clip_high (above clip_low: DAPO's asymmetric "
        "clip-higher)",
    )
    norm_by_std: bool = Field(
        default=True,
        description="divide each group's mean-centred scores by the group's std (+ eps); false: only subtract "
        "the group mean",
    )
    eps: Annotated[float, Field(gt=0)] = Field(default=1e-6, description="added to the group's std before dividing")
    kl_coef: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="weight of the KL to models.reference (0: off; > 0 needs models.reference)"
    )
    kl_estimator: KlEstimator = Field(
        default="k3",
        description="the per-token estimator of KL(student || reference): k1, k2, k3 or low_var_kl (verl's names "
        "and formulas)",
    )
    kl_mode: KlMode = Field(
        default="loss",
        description="'loss': kl_coef x KL token mean added to the loss; 'reward': kl_coef x summed KL "
        "subtracted from each trajectory's score before the group advantages",
    )


class PpoSection(Strict):
    """PPO with a critic (token-level values, GAE, clipped policy and value losses).

    Like GRPO's ``ppo_epochs``/``mini_batches`` (and unlike OPD), PPO reuses one rollout for
    ``ppo_epochs x mini_batches`` actor updates: the one-update-per-cycle on-policy rule does not apply
    (the importance ratio against the rollout policy and its clip keep those updates proximal).
    ``train.gradient_accumulation_steps`` is the trajectories of one mini-batch. The critic makes its own
    ``critic_ppo_epochs x critic_mini_batches`` steps (``None``: the actor's values, as verl defaults them).
    """

    gamma: Annotated[float, Field(ge=0, le=1)] = Field(default=1.0, description="GAE's discount per response token")
    lam: Annotated[float, Field(ge=0, le=1)] = Field(default=0.95, description="GAE's lambda")
    ppo_epochs: Annotated[int, Field(ge=1)] = Field(default=1, description="the actor's passes over each rollout")
    mini_batches: Annotated[int, Field(ge=1)] = Field(
        default=1,
        description="the actor's mini-batches per pass, one optimizer step each; must divide the trajectories "
        "per cycle",
    )
    clip_low: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.2, description="the importance ratio's lower clip bound is 1 - clip_low"
    )
    clip_high: Annotated[float, Field(ge=0)] = Field(
        default=0.2,
        description="the importance ratio's upper clip bound is 1 + clip_high (above clip_low: DAPO's asymmetric "
        "clip-higher)",
    )
    value_clip: Annotated[float, Field(gt=0)] = Field(
        default=0.5,
        description="the critic's value clip: a new value counts at most this far from the rollout's old value "
        "(verl's cliprange_value)",
    )
    whiten_advantages: bool = Field(
        default=True,
        description="whiten the GAE advantages over the rollout's response tokens (the returns stay unwhitened)",
    )
    shuffle_mini_batches: bool = Field(
        default=True,
        description="split each pass into mini-batches in an order shuffled from (run.seed, update, pass), so a "
        "resume replays it; false: rollout order",
    )
    critic_ppo_epochs: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="the critic's passes over each rollout (null: ppo_epochs)"
    )
    critic_mini_batches: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="the critic's mini-batches per pass (null: mini_batches); must divide the trajectories per cycle",
    )
    critic_learning_rate: Annotated[float, Field(gt=0)] = Field(
        default=1e-4, description="the critic's AdamW learning rate (its LoRA and value head; constant)"
    )
    critic_max_grad_norm: Annotated[float, Field(gt=0)] | None = Field(
        default=1.0, description="the critic's gradient-norm clip per optimizer step (null: no clipping)"
    )
    critic_head_seed: Seed = Field(
        default=0, description="the seed of the value head's initialization (apart from the global generators)"
    )
    kl_coef: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="weight of the KL to models.reference (0: off; > 0 needs models.reference)"
    )
    kl_estimator: KlEstimator = Field(
        default="k1",
        description="the per-token estimator of KL(student || reference): k1, k2, k3 or low_var_kl (verl's names "
        "and formulas)",
    )
    kl_mode: KlMode = Field(
        default="reward",
        description="'reward': kl_coef x per-token KL subtracted from the token rewards before GAE; "
        "'loss': kl_coef x KL token mean added to the actor loss",
    )

    @property
    def critic_epoch_count(self) -> int:
        """The critic's passes per cycle: ``critic_ppo_epochs``, or the actor's ``ppo_epochs``."""
        return self.ppo_epochs if self.critic_ppo_epochs is None else self.critic_ppo_epochs

    @property
    def critic_mini_batch_count(self) -> int:
        """The critic's mini-batches per pass: ``critic_mini_batches``, or the actor's ``mini_batches``."""
        return self.mini_batches if self.critic_mini_batches is None else self.critic_mini_batches


class DistillSection(Strict):
    objective: Literal["exact", "topk_tail"] = Field(
        default="exact",
        description="'exact': the divergence over the whole vocabulary; 'topk_tail': over the teacher's top_k "
        "tokens plus one bucket for the rest",
    )
    divergence: Literal["reverse_kl", "forward_kl", "jsd"] = Field(
        default="reverse_kl",
        description="reverse_kl = KL(student || teacher) (opd's default), forward_kl = KL(teacher || student) "
        "(kd's when unset), jsd = the generalized JSD weighted by beta",
    )
    top_k: Annotated[int, Field(ge=1)] = Field(
        default=32, description="the teacher's most likely tokens kept per position by objective topk_tail"
    )
    beta: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.5, description="jsd's teacher weight (0.5: the symmetric JSD); read only by jsd"
    )
    temperature: Annotated[float, Field(gt=0)] = Field(
        default=1.0, description="the softmax temperature of both the student's and the teacher's logits"
    )


class OfflineSection(Strict):
    """SFT and offline KD: no rollout. Each update takes ``rollout.prompts_per_cycle`` dataset rows; a
    row's oracle trajectory is its prompt (rendered as for rollout) followed by the ``target_column``
    text (+ EOS with ``append_eos``). SFT: cross-entropy on those tokens. KD: the ``algorithm.distill``
    divergence to the teacher at those positions (forward KL unless ``distill.divergence`` is set).

    ``teacher_cache`` (KD only): a directory of teacher targets for every row of the dataset. It is
    reused when it matches (same rows, teacher identity and settings), built from the teacher when
    absent, and refused when stale or corrupt.
    """

    target_column: Literal["answer", "context"] = Field(
        default="answer", description="the dataset column whose text is the oracle response"
    )
    append_eos: bool = Field(default=True, description="end the oracle response with the tokenizer's EOS token")
    teacher_cache: str | None = Field(
        default=None,
        description="kd only: a directory of teacher targets for every dataset row (reused when it matches, "
        "built when absent, refused when stale or corrupt)",
    )


class AlgorithmSection(Strict):
    name: Literal["grpo", "opd", "ppo", "sft", "kd"] = Field(
        default="grpo",
        description="the algorithm: grpo, opd (strict on-policy distillation), ppo (with a critic), or the "
        "offline sft and kd (no rollout)",
    )
    grpo: GrpoSection = Field(default_factory=GrpoSection, description="GRPO's settings (algorithm grpo)")
    ppo: PpoSection = Field(default_factory=PpoSection, description="PPO's settings (algorithm ppo)")
    offline: OfflineSection = Field(
        default_factory=OfflineSection, description="SFT's and offline KD's settings (algorithm sft, kd)"
    )
    distill: DistillSection = Field(
        default_factory=DistillSection, description="the student-teacher divergence of opd and kd"
    )
    rewards: list[RewardTerm] = Field(
        default_factory=lambda: [RewardTerm(name="calculator_exact")],
        description="the weighted reward terms summed into each trajectory's score (grpo and ppo need at least one)",
    )
    #: every k updates, a greedy evaluation on ``data.eval_path`` goes into the metrics line (None: off)
    eval_every: Annotated[int, Field(ge=1)] | None = None
    old_logp: Literal["recompute", "rollout"] = Field(
        default="recompute",
        description="where a policy-gradient update (grpo, ppo) takes old_logp from: 'recompute' (the training "
        "model, always sound) or 'rollout' (the rollout's sampled log-probs: only the trainer's own under plain "
        "sampling; refused with rollout.backend vllm, whose log-probs are another engine's)",
    )
