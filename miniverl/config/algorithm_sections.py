"""The ``algorithm`` section: which algorithm trains, with its rewards and each algorithm's own settings."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from miniverl.config.fields import KlEstimator, KlMode, Seed, Strict


class RewardTerm(Strict):
    name: str
    weight: float = 1.0
    params: dict[str, float | int | str | bool] = Field(default_factory=dict)


class GrpoSection(Strict):
    """GRPO's loss and its passes over one rollout (verl's ``ppo_epochs`` and ``ppo_mini_batch_size``).

    ``ppo_epochs`` passes over the cycle's trajectories, each split into ``mini_batches`` mini-batches of
    whole prompt groups (verl's ``train_batch_size / ppo_mini_batch_size``), one optimizer step each; the
    old log-probs are computed once before the first pass, so later steps see a ratio != 1 and the clip
    acts. ``train.gradient_accumulation_steps`` is the trajectories of one mini-batch.
    """

    ppo_epochs: Annotated[int, Field(ge=1)] = 1
    mini_batches: Annotated[int, Field(ge=1)] = 1
    shuffle_mini_batches: bool = True
    clip_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_high: Annotated[float, Field(ge=0)] = 0.2
    norm_by_std: bool = True
    eps: Annotated[float, Field(gt=0)] = 1e-6
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    kl_estimator: KlEstimator = "k3"
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

    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    ppo_epochs: Annotated[int, Field(ge=1)] = 1
    mini_batches: Annotated[int, Field(ge=1)] = 1
    clip_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_high: Annotated[float, Field(ge=0)] = 0.2
    value_clip: Annotated[float, Field(gt=0)] = 0.5
    whiten_advantages: bool = True
    shuffle_mini_batches: bool = True
    critic_ppo_epochs: Annotated[int, Field(ge=1)] | None = None
    critic_mini_batches: Annotated[int, Field(ge=1)] | None = None
    critic_learning_rate: Annotated[float, Field(gt=0)] = 1e-4
    critic_max_grad_norm: Annotated[float, Field(gt=0)] | None = 1.0
    critic_head_seed: Seed = 0
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    kl_estimator: KlEstimator = "k1"
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
    objective: Literal["exact", "topk_tail"] = "exact"
    divergence: Literal["reverse_kl", "forward_kl", "jsd"] = "reverse_kl"
    top_k: Annotated[int, Field(ge=1)] = 32
    beta: Annotated[float, Field(gt=0, lt=1)] = 0.5
    temperature: Annotated[float, Field(gt=0)] = 1.0


class OfflineSection(Strict):
    """SFT and offline KD: no rollout. Each update takes ``rollout.prompts_per_cycle`` dataset rows; a
    row's oracle trajectory is its prompt (rendered as for rollout) followed by the ``target_column``
    text (+ EOS with ``append_eos``). SFT: cross-entropy on those tokens. KD: the ``algorithm.distill``
    divergence to the teacher at those positions (forward KL unless ``distill.divergence`` is set).

    ``teacher_cache`` (KD only): a directory of teacher targets for every row of the dataset. It is
    reused when it matches (same rows, teacher identity and settings), built from the teacher when
    absent, and refused when stale or corrupt.
    """

    target_column: Literal["answer", "context"] = "answer"
    append_eos: bool = True
    teacher_cache: str | None = None


class AlgorithmSection(Strict):
    name: Literal["grpo", "opd", "ppo", "sft", "kd"] = "grpo"
    grpo: GrpoSection = Field(default_factory=GrpoSection)
    ppo: PpoSection = Field(default_factory=PpoSection)
    offline: OfflineSection = Field(default_factory=OfflineSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    rewards: list[RewardTerm] = Field(default_factory=lambda: [RewardTerm(name="calculator_exact")])
    #: every k updates, a greedy evaluation on ``data.eval_path`` goes into the metrics line (None: off)
    eval_every: Annotated[int, Field(ge=1)] | None = None
    old_logp: Literal["recompute", "rollout"] = Field(
        default="recompute",
        description="where a policy-gradient update (grpo, ppo) takes old_logp from: 'recompute' (the training "
        "model, always sound) or 'rollout' (the rollout's sampled log-probs: only the trainer's own under plain "
        "sampling; refused with rollout.backend vllm, whose log-probs are another engine's)",
    )
