"""The workload registry: what each qualification level runs, its required checks and principal record."""

from __future__ import annotations

from harness.core.errors import UsageError
from harness.core.records import WorkloadRegistry, WorkloadSpec

SMOKE_RECORD = "qualification-release-smoke.json"

# Every check the release smoke executes, in order. CUDA-only checks are not_applicable on CPU.
SMOKE_CHECKS = [
    "candidate_validated",
    "known_good_integrity",
    "clean_worktree",
    "wheel_sha256_before_install",
    "fresh_venv",
    "install",
    "pip_check",
    "stack_matches_known_good",
    "python_version",
    "origin_installed_version",
    "origin_import_under_venv",
    "origin_not_checkout",
    "origin_not_editable",
    "origin_record_hashes",
    "origin_wheel_hash",
    "origin_executable_under_venv",
    "candidate_bound",
    "cli_version",
    "doctor",
    "gpu_identity",
    "model_fetch",
    "data_sample",
    "plan",
    "run_dry_run",
    "run_opd",
    "teacher_scoring",
    "optimizer_update",
    "inspect",
    "export_reload",
    "grpo_plan",
    "grpo_cycle",
    "teardown",
    "peak_reserved",
    "evidence_portable",
    "evidence_bounded",
]
# Recorded while the qualification directory is written, after every CLI step.
EVIDENCE_CHECKS = ("evidence_portable", "evidence_bounded")
# Checks that measure the GPU: on a CPU profile they measure nothing, so they are not required there (a judge
# records them not_applicable with the reason, never passed).
CUDA_ONLY = {"gpu_identity", "teardown", "peak_reserved", "vram_measured", "reward_model_offloaded"}
# Workload checks required only on the profiles named (elsewhere their judge records them not_applicable, with why):
# a speed ratio is a threshold only on a dedicated machine (the CUDA profiles; a shared CI CPU records it and shows
# it), and only the release card's known-good stack is meant to include vLLM, whose policy-gradient boundary
# `vllm_boundary` measures.
REQUIRED_ONLY_ON: dict[tuple[str, str], tuple[str, ...]] = {
    ("backend-matrix", "speed_thresholds"): ("rtx4080-wsl2-cu130", "h100-cu130", "h200-cu130"),
    ("backend-matrix", "vllm_boundary"): ("rtx4080-wsl2-cu130",),
}

# `--set` overrides for the harness workload YAMLs, by profile device.
DEVICE_OVERRIDES = {"cpu": ["models.device=cpu"], "cuda": ["models.device=cuda"]}

REGISTRY = WorkloadRegistry(
    kind="miniverl.workload-registry",
    schema_version=1,
    workloads=[
        WorkloadSpec(
            name="release-smoke",
            description="installed CLI: doctor/plan/dry-run, OPD actor+teacher one rollout/score/update, "
            "one GRPO cycle, PEFT export/reload, CUDA teardown",
            principal_record=SMOKE_RECORD,
            asset_role="principal",
            required_checks=SMOKE_CHECKS,
            provided=True,
            provided_by="harness/qualify/smoke.py",
        ),
        WorkloadSpec(
            name="direct-gkd",
            description="direct-config GKD (forward-KL top-k) workflow on the exact candidate wheel",
            principal_record="qualification-direct-gkd.json",
            asset_role="principal",
            required_checks=["run_completed", "resume_tensor_exact", "export_reload", "peak_reserved"],
            provided=True,
            provided_by="harness/qualify/full/direct_gkd.py",
        ),
        WorkloadSpec(
            name="pg-k1",
            description="policy-gradient with the k1 KL estimator: GRPO cycles with nonzero advantages",
            principal_record="qualification-pg-k1.json",
            asset_role="principal",
            required_checks=[
                "run_completed",
                "reward_varies_within_group",
                "nonzero_advantages",
                "adapter_changed",
                "kl_measured",
            ],
            provided=True,
            provided_by="harness/qualify/full/pg_k1.py",
        ),
        WorkloadSpec(
            name="smollm2",
            description="the embedded SmolLM2 canonical resume workload (interrupt/resume tensor replay)",
            principal_record="qualification-smollm2.json",
            asset_role="principal",
            required_checks=["run_completed", "resume_tensor_exact", "teardown"],
            provided=True,
            provided_by="harness/qualify/full/smollm2.py",
        ),
        WorkloadSpec(
            name="backend-matrix",
            description="the preregistered 24-cell runtime matrix (harness/preregistration/backend-matrix-v3.json): "
            "conformance, speed thresholds, policy refreshes per rollout backend, grouped trajectories, vLLM boundary",
            principal_record="backend-matrix.json",
            asset_role="subordinate",
            required_checks=[
                "all_cells_completed",
                "conformance",
                "speed_thresholds",
                "policy_refreshes",
                "grouped_trajectory_identity",
                "vllm_boundary",
                "teardown",
            ],
            provided=True,
            provided_by="harness/qualify/full/backend_matrix.py",
        ),
        WorkloadSpec(
            name="grpo-cycles",
            description="two NF4 LoRA GRPO cycles: varying reward, nonzero advantages, two changing updates",
            principal_record="grpo-cycles.json",
            asset_role="subordinate",
            required_checks=[
                "reward_varies_within_group",
                "nonzero_advantages",
                "two_updates_changed",
                "peak_reserved",
                "verl_plan_compiled",
            ],
            provided=True,
            provided_by="harness/qualify/full/grpo_cycles.py",
        ),
        WorkloadSpec(
            name="ppo-rm-handoff",
            description="PPO actor+critic updates, GAE, reward-model role, resume, verl v0.9 handoff diagnosis",
            principal_record="ppo-rm-handoff.json",
            asset_role="subordinate",
            required_checks=[
                "actor_updates",
                "critic_updates",
                "gae_nontrivial",
                "resume_tensor_exact",
                "reward_model",
                "reward_model_offloaded",
                "handoff",
            ],
            provided=True,
            provided_by="harness/qualify/full/ppo_rm_handoff.py",
        ),
        WorkloadSpec(
            name="product-workflows",
            description="installed-package PPO/GRPO walkthrough from a fresh working dir (v014/product-workflows.json)",
            principal_record="product-workflows.json",
            asset_role="subordinate",
            required_checks=[
                "cli_invocations",
                "tensor_replay",
                "records_unduplicated",
                "vram_measured",
                "walkthrough_record",
            ],
            provided=True,
            provided_by="harness/qualify/full/product_workflows.py",
        ),
        WorkloadSpec(
            name="direct-config",
            description="native verl 0.9 GRPO and PPO YAMLs with 2 epochs x 2 mini-batches run unedited (compiler "
            "v4): runs, actor steps and critic steps per line as verl counts them, tensor-exact actor and critic "
            "replay, IR/rules digests, launch status (v015/direct-config.json)",
            principal_record="direct-config.json",
            asset_role="subordinate",
            required_checks=[
                "run_completed",
                "native_bytes_unchanged",
                "actor_passes",
                "critic_counts",
                "resume_tensor_exact",
                "handoff_digests",
                "launch_status",
            ],
            provided=True,
            provided_by="harness/qualify/full/direct_config.py",
        ),
    ],
)


def workload(name: str) -> WorkloadSpec:
    for spec in REGISTRY.workloads:
        if spec.name == name:
            return spec
    raise UsageError(f"unknown workload {name!r}", check="workload")


GRPO_CHECKS = {"grpo_plan", "grpo_cycle"}


def required_smoke_checks(device: str, *, grpo: bool = True) -> list[str]:
    """CUDA-only checks are not required on CPU; the GRPO cycle is not required when skipped on purpose."""
    return [c for c in SMOKE_CHECKS if (device == "cuda" or c not in CUDA_ONLY) and (grpo or c not in GRPO_CHECKS)]
