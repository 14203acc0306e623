"""Every file format miniverl writes, as pydantic models with ``extra="forbid"``.

JSON Schemas in ``manifests/miniverl/`` are generated from these (``miniverl schemas --out``);
a test fails when they drift.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

SHA256 = Field(pattern=r"^[0-9a-f]{64}$")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataBinding(Record):
    path: str
    sha256: str = SHA256
    rows: int = Field(ge=1)


class PlacementPlan(Record):
    """An estimate made without loading weights; the run measures the real figures."""

    device: Literal["auto", "cpu", "cuda"]
    runtime: Literal["dual_model", "shared_backbone"]
    physical_models: int
    dtype: str
    quantization: str
    estimated_weight_bytes: int | None
    estimated_trainable_params: int | None
    estimated_optimizer_bytes: int | None
    basis: str


class NativeSource(Record):
    """A native verl YAML imported by ``miniverl plan --verl-config`` (its exact bytes, as UTF-8 text)."""

    name: str
    sha256: str = SHA256
    bytes: int = Field(ge=0)
    text: str


class DirectConfig(Record):
    """Direct-config evidence (compiler ``verl-rl-v0.9-single-gpu-v4``): the native file and the bindings."""

    compiler: Literal["verl-rl-v0.9-single-gpu-v4"]
    native: NativeSource
    runtime_bindings: dict[str, Any]
    rules_digest: str = SHA256
    import_digest: str = SHA256
    decisions: dict[str, str]


class PlanExtension(Record):
    """One ``run --resume --extend N``: the plan it extended (by digest) and the cycles it added."""

    previous_plan_digest: str = SHA256
    previous_cycles: int = Field(ge=1)
    added_cycles: int = Field(ge=1)


class PlanHandoffRefusal(Record):
    code: str
    message: str


class PlanHandoff(Record):
    """What ``miniverl handoff plan.json`` compiles (``miniverl/handoff/plan_section.py``; the IR does not
    contain the plan digest): ``status: compiles`` with ``compiler`` and ``ir_digest``, or ``refused`` with the
    rule's ``refusal`` (``unchecked`` when the model's ``config.json`` could not be read here; ``refusal.code``
    is then ``model_config_unavailable``).

    ``compiler`` is the compiler that compiles (or refused) the plan's experiment; ``imported_by`` is
    ``verl-rl-v0.9-single-gpu-v4`` for a direct-config plan (its import rules digest is the plan's
    ``direct_config.rules_digest``). ``rules_digest`` is the digest of ``compiler``'s rules table.
    """

    status: Literal["compiles", "refused", "unchecked"]
    compiler: str
    imported_by: str | None = None
    ir_digest: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    rules_digest: str = SHA256
    refusal: PlanHandoffRefusal | None = None


class PlanRecord(Record):
    kind: Literal["miniverl.plan"] = "miniverl.plan"
    schema_version: Literal[1] = 1
    miniverl_version: str
    config: dict[str, Any]
    overrides: list[str]
    config_digest: str = SHA256
    data: DataBinding
    models: dict[str, dict[str, Any]]
    placement: PlacementPlan
    cycles: int
    trajectories_per_cycle: int
    updates: int
    direct_config: DirectConfig | None = None
    #: ``data.eval_path`` bound by content (``algorithm.eval_every``); None without one
    eval_data: DataBinding | None = None
    #: every extension of this plan, oldest first; the previous plans are kept in ``RUN_DIR/plans/``
    lineage: list[PlanExtension] = Field(default_factory=list)
    #: the verl hand-off verdict of this plan; None only for plans written before it existed
    handoff: PlanHandoff | None = None
    plan_digest: str = SHA256

    @model_serializer(mode="wrap")
    def _omit_absent_direct_config(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        # a plan compiled from a miniverl config has no direct_config key (its digest is unchanged)
        out = handler(self)
        for key in ("direct_config", "handoff"):
            if isinstance(out, dict) and out.get(key, 0) is None:
                out.pop(key)
        return out


class CheckpointFile(Record):
    sha256: str = SHA256
    bytes: int = Field(ge=0)


class CheckpointRecord(Record):
    """``checkpoint.json``: written last, so its presence marks a complete checkpoint."""

    kind: Literal["miniverl.checkpoint"] = "miniverl.checkpoint"
    schema_version: Literal[2] = 2
    step: int = Field(ge=1)
    cycle: int = Field(ge=1)
    policy_version: int = Field(ge=0)
    data_cursor: int = Field(ge=0)
    plan_digest: str = SHA256
    config_digest: str = SHA256
    files: dict[str, CheckpointFile]
    #: the commit point of step ``step``: ``metrics.jsonl`` keeps exactly this many lines (the ones in
    #: ``state.json``) and ``trajectories/`` exactly these files (name -> sha256); on resume the run
    #: directory is rolled back to them
    metrics_lines: int = Field(ge=1)
    trajectories: dict[str, str]


class RunManifest(Record):
    kind: Literal["miniverl.run"] = "miniverl.run"
    schema_version: Literal[1] = 1
    run_id: str
    miniverl_version: str
    plan_digest: str = SHA256
    config_digest: str = SHA256
    data_sha256: str = SHA256
    algorithm: str
    runtime: str
    roles: dict[str, Any]
    models: dict[str, dict[str, Any]]


class MetricsLine(Record):
    step: int
    cycle: int
    policy_version: int
    algorithm: str
    loss: float
    reward_mean: float | None
    reward_std: float | None
    reward_std_within_group_max: float | None
    nonzero_advantages: int | None
    kl: float | None
    grad_norm: float
    adapter_delta_norm: float
    response_tokens: int
    trajectories: int
    rollout_seconds: float
    update_seconds: float
    cycle_seconds: float
    peak_reserved_bytes: int | None
    peak_allocated_bytes: int | None
    update_start_allocated_bytes: int | None = Field(
        default=None,
        description="CUDA memory allocated when the update phase starts (after rollout and scoring): what stays "
        "on the device between phases, e.g. a resident reward model; null on CPU",
    )
    algorithm_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="the algorithm's own metrics under verl's names (PPO: actor/pg_clipfrac, actor/ppo_kl, "
        "actor/entropy, critic/vf_loss, critic/vf_clipfrac, critic/vf_explained_var, ...); GRPO and PPO, every "
        "backend: the rollout/trainer agreement over the cycle's response tokens "
        "(rollout/mismatch_ratio_outside_frac: the fraction whose exp(trainer - rollout log-prob) is outside "
        "[0.9, 1.1]; actor/old_logp_max_abs_diff and rollout/mismatch_mean_abs_logp_diff: the max and mean "
        "|difference|; rollout/mismatch_tokens); finite values only",
    )
    rollout_backend: Literal["fast", "hf", "vllm"] | None = Field(
        default=None,
        description="what generated this cycle's samples: 'fast' (folded policy copy), 'hf' (the transformers "
        "decode loop) or 'vllm' (the colocated vLLM); null when the cycle sampled nothing (SFT, KD)",
    )
    policy_digest_rollout: str | None = Field(
        default=None,
        description="sha256 of the trainable student adapter tensors the rollout used: for 'fast', of the snapshot "
        "its fold was made from (a reused fold reports its own snapshot); for 'hf', of the live tensors at rollout "
        "start. Equals policy_digest_before on every fresh-policy line; null when the cycle sampled nothing",
    )
    policy_digest_before: str | None = Field(
        default=None,
        description="sha256 of the trainable student adapter tensors just before this cycle's optimizer update "
        "(equals the previous line's policy_digest_after)",
    )
    policy_digest_after: str | None = Field(
        default=None,
        description="sha256 of the trainable student adapter tensors just after this cycle's optimizer update. "
        "Digest: for each tensor in sorted name order, name, dtype, shape and byte count (NUL-separated), then "
        "its raw contiguous CPU bytes",
    )


class CudaTeardown(Record):
    baseline_allocated_bytes: int
    final_allocated_bytes: int
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    teardown_tolerance_bytes: int
    teardown_returned_to_baseline: bool


class RunSummary(Record):
    kind: Literal["miniverl.run-summary"] = "miniverl.run-summary"
    schema_version: Literal[1] = 1
    run_id: str
    status: Literal["completed", "failed"]
    reason: str | None = None
    algorithm: str
    runtime: str
    device: str
    dtype: str
    quantization: str
    cycles: int
    updates: int
    resumed_from_step: int | None
    reward_mean: float | None
    reward_std_within_group_max: float | None
    nonzero_advantages: int | None
    adapter_changed_each_update: bool
    wall_seconds: float
    seconds_per_cycle: float | None
    cuda: CudaTeardown | None
    torch_threads: int | None = None
    peak_rss_bytes: int | None = Field(
        default=None,
        description="the run process's peak resident set size in bytes (getrusage ru_maxrss), load included; "
        "the host memory a machine needs for this run (on CUDA, host memory only)",
    )
    plan_digest: str = SHA256
    model_identities: dict[str, dict[str, Any]]


class ExportReload(Record):
    max_abs_logit_diff: float
    tolerance: float
    passed: bool
    probe_tokens: int


class CriticReload(Record):
    """The exported critic (PEFT adapter + value head) reloaded on a fresh base gives the trained values."""

    max_abs_value_diff: float
    tolerance: float
    passed: bool
    probe_tokens: int


class CriticExport(Record):
    directory: str
    base_model: dict[str, Any]
    files: dict[str, CheckpointFile]
    reload: CriticReload


class ExportManifest(Record):
    kind: Literal["miniverl.adapter-export"] = "miniverl.adapter-export"
    schema_version: Literal[1] = 1
    miniverl_version: str
    run_id: str
    step: int
    roles: dict[str, Any]
    base_model: dict[str, Any]
    adapter_provenance: dict[str, Any]
    files: dict[str, CheckpointFile]
    reload: ExportReload
    critic: CriticExport | None = Field(
        default=None, description="PPO runs: the critic, exported as its own directory beside the actor adapter"
    )
