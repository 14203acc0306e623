"""The direct-config workload's layout: the two native verl files it runs, what each must plan, run and hand off, the
counts they declare, and the evidence members of each (the run side writes them, the judge reads them)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import WorkloadFailure

NAME = "direct-config"
FOLDER = "v015/direct-config"
INPUTS = wt.WORKLOADS  # where the native files this workload runs are
MODEL = "smollm2-135m-instruct"  # the runtime binding of actor_rollout_ref.model.path (the embedded SmolLM2)
TRAJECTORY_BATCH = 8  # micro-batching only (runtime binding): the trajectories of one forward pass
# The native files' data.train_batch_size, rollout.n and data.max_response_length, which the import maps.
NATIVE_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 4, "max_new_tokens": 32}
CYCLES = 2  # the native trainer.total_training_steps
EXTEND = 1
REPLAY_FIRST = 1  # the replay's cycles before `--resume --extend`
COMPILER_V4 = "verl-rl-v0.9-single-gpu-v4"
# What the native files declare and this workload exists to show: repeated passes over several mini-batches.
ACTOR_EPOCHS, ACTOR_MINI_BATCHES = 2, 2
CRITIC_EPOCHS, CRITIC_MINI_BATCHES = 1, 2
ACTOR_KEYS = (
    "actor_rollout_ref.actor.ppo_epochs",
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
)
CRITIC_KEYS = ("critic.ppo_epochs", "data.train_batch_size", "critic.ppo_mini_batch_size")
ACTOR_OPTIMIZER, CRITIC_OPTIMIZER = "optimizer.safetensors", "critic_optimizer.safetensors"
CRITIC_STATE = ("critic_params.safetensors", CRITIC_OPTIMIZER)


@dataclass(frozen=True)
class Config:
    """One native file of the workload and what its plan, run and handoff must be."""

    key: str  # grpo | ppo: evidence folder, role prefix and step suffix
    native: str  # the native file, under INPUTS
    algorithm: str
    compiler: str  # the verl compiler the v4 import hands the plan to
    critic: bool

    @property
    def replay(self) -> str:
        return self.native.removesuffix(".yaml") + "-one-step.yaml"

    def role(self, name: str) -> str:
        return f"{self.key}_{name}"

    def step(self, name: str) -> str:
        return f"{name}_{self.key}"

    @property
    def run_id(self) -> str:
        return f"{self.key}-native"

    @property
    def replay_id(self) -> str:
        return f"{self.key}-replay"


CONFIGS = (
    Config("grpo", "verl-native-grpo-2x2.yaml", "grpo", wt.VERL_COMPILER_GRPO, critic=False),
    Config("ppo", "verl-native-ppo.yaml", "ppo", wt.VERL_COMPILER_PPO, critic=True),
)
# The replay's file: one line of the native file changed (a new file in the work dir, never the input).
REPLAY_LINE = ("  total_training_steps: 2\n", "  total_training_steps: 1\n")

# Evidence member (under FOLDER/<config>/) of each per-config role.
PER_CONFIG = {
    "native_sha256": "native-sha256.json",
    "plan_output": "plan-output.json",
    "plan": "plan.json",
    "run_output": "run-output.json",
    "inspect_2": "inspect-2.json",
    "resume_output": "resume-output.json",
    "inspect_3": "inspect-3.json",
    "summary": "run/summary.json",
    "metrics": "run/metrics.jsonl",
    "checkpoint_1": "run/checkpoint-1.json",
    "checkpoint_2": "run/checkpoint-2.json",
    "checkpoint_3": "run/checkpoint-3.json",
    "replay_first_output": "replay/first-output.json",
    "replay_summary": "replay/summary.json",
    "replay_metrics": "replay/metrics.jsonl",
    "replay_checkpoint_2": "replay/checkpoint-2.json",
    "handoff": "handoff.json",
    "bundle_manifest": "bundle/manifest.json",
    "bundle_native": "bundle/native.yaml",
    "native_diff": "bundle/native-diff.json",
    "diagnose": "diagnose.json",
}
SHARED = {
    "transcript": "transcript.json",
    "state_hashes": "state-hashes.json",
    "diagnose_environment": "diagnose-environment.json",
}
EVIDENCE = {role: f"{FOLDER}/{member}" for role, member in SHARED.items()} | {
    c.role(role): f"{FOLDER}/{c.key}/{member}" for c in CONFIGS for role, member in PER_CONFIG.items()
}

# The straight run's kept checkpoints, whose optimizer state is counted: (role of its checkpoint.json, its step).
# (The replay's step-2 state is the straight run's, byte for byte: resume_tensor_exact.)
COUNTED = tuple((f"checkpoint_{step}", step) for step in range(1, CYCLES + EXTEND + 1))


def one_line_changed(native: bytes, line: str, replacement: str, name: str) -> bytes:
    """``native`` with its one line equal to ``line`` replaced (whole lines: an indented key is another line)."""
    lines = native.decode("utf-8").splitlines(keepends=True)
    found = [i for i, text in enumerate(lines) if text == line]
    if len(found) != 1:
        raise WorkloadFailure(f"{name} does not hold the line {line.strip()!r} exactly once")
    lines[found[0]] = replacement
    return "".join(lines).encode("utf-8")
