"""The refresh runs' layout (part of the backend-matrix workload; see :mod:`harness.qualify.full.refresh`): the
engines, the sizes every refresh run uses, the vLLM evidence contract's names and bounds, and the archive member of
every evidence role."""

from __future__ import annotations

from harness.core.proc import HARNESS_DIR
from harness.qualify.full import runs

WORKLOADS = HARNESS_DIR / "workloads"
YAML = "refresh-grpo.yaml"
ENGINES = ("fast", "hf")
#: the most refreshes an evidence layout declares (every scale asks for 8)
MAX_REFRESHES = 8
ROOT = "v011/backend-matrix/refresh"
RUN_OUTPUT = "refresh-runs"
ADAPTER = runs.ADAPTER

#: the one line ``miniverl plan`` must refuse ``rollout.backend: vllm`` with where vllm is absent
VLLM_REFUSAL_PREFIX = "miniverl: error: rollout.backend vllm: "
VLLM_ABSENT_REASON = "vllm is not installed"
#: the algorithm_metrics key a policy-gradient update sets to 1.0 when the trainer recomputed old_logp
OLD_LOGP_RECOMPUTED = "actor/old_logp_recomputed"
#: the algorithm_metrics key a vLLM run reports: max |sampled_logprobs - old_logprobs| over the cycle's tokens
OLD_LOGP_MAX_ABS_DIFF = "actor/old_logp_max_abs_diff"
VLLM_BACKEND = "vllm"
#: every refresh chain the layout declares: the in-process engines, then the vLLM backend (run where accepted)
REFRESH_RUNS = (*ENGINES, VLLM_BACKEND)
#: what every trajectory of a vLLM run must carry (the contract issue #32's vLLM rollout path must meet)
VLLM_TRAJECTORY_FIELDS = {
    "rollout_backend": "the literal 'vllm': the engine that sampled it",
    "rollout_backend_version": "vllm.__version__ of the engine that sampled it (one version for the run)",
    "sampled_logprobs": "the sampler's log-prob of each response token, as vLLM returned it",
    "old_logprobs": "the trainer's recomputed log-prob of each response token under the rollout's weights",
}
#: a foreign engine's log-probs differ from the trainer's somewhere by more than this (equal ones are the trainer's)
VLLM_MIN_LOGP_DIFFERENCE = 1e-6
#: the metrics line's max |sampled - old| must be the judge's own, within this
VLLM_DIFF_AGREEMENT = 1e-6


def trajectory_role(engine: str, cycle: int) -> str:
    return f"refresh_{engine}_trajectories_{cycle}"


def checkpoint_role(engine: str, cycle: int) -> str:
    """The evidence role of update ``cycle``'s kept checkpoint.json, and its label in the engine's state hashes."""
    return f"refresh_{engine}_checkpoint_{cycle}"


def plan_role(engine: str) -> str:
    """The role of the plan a refresh run ran (for vllm ``refresh_vllm_plan`` is the probe's result)."""
    return "refresh_vllm_run_plan" if engine == VLLM_BACKEND else f"refresh_{engine}_plan"


def _evidence() -> dict[str, str]:
    members: dict[str, str] = {}
    members["refresh_vllm_plan"] = f"{ROOT}/vllm/plan-result.json"
    members["refresh_vllm_engine"] = f"{ROOT}/vllm/engine.json"
    for engine in REFRESH_RUNS:
        members[plan_role(engine)] = f"{ROOT}/{engine}/plan.json"
        members[f"refresh_{engine}_summary"] = f"{ROOT}/{engine}/summary.json"
        members[f"refresh_{engine}_metrics"] = f"{ROOT}/{engine}/metrics.jsonl"
        members[f"refresh_{engine}_state_hashes"] = f"{ROOT}/{engine}/state-hashes.json"
        for cycle in range(1, MAX_REFRESHES + 1):
            members[trajectory_role(engine, cycle)] = f"{ROOT}/{engine}/trajectories/cycle-{cycle:06d}.jsonl"
            members[checkpoint_role(engine, cycle)] = f"{ROOT}/{engine}/checkpoints/checkpoint-{cycle}.json"
    return members


#: role -> archive member of every file :func:`run_refreshes` may return
REFRESH_EVIDENCE: dict[str, str] = _evidence()


# The rollout sizes of every refresh run, on every profile (declared here, recorded in the plan, judged).
REFRESH_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 4, "max_new_tokens": 16}
