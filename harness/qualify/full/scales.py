"""The sizes each profile runs the full workloads at. A reduced size is declared here, never applied silently;
the record names the scale it ran."""

from __future__ import annotations

from dataclasses import replace

from harness.qualify.full.base import ModelUse, Scale

# The seed's models (grpo-cycles: Qwen3-0.6B NF4 LoRA GRPO; v0.13: Qwen3-0.6B actor updates and a DistilBERT
# sequence-classifier reward role), at the revisions the product's pins record (miniverl/models/pins/*.json, where
# each revision's source is written down). Only the release card has a hub; elsewhere SmolLM2 and the seeded tiny
# classifier stand in, and the record says so.
SEED_STUDENT = "Qwen/Qwen3-0.6B"
SEED_STUDENT_REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"
SEED_REWARD = "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
SEED_REWARD_REVISION = "ef2f51c8f6a09fb8c418d1ccbda386970ed2d53f"
STAND_INS = (
    ModelUse("student", SEED_STUDENT, "builtin", "smollm2-135m-instruct"),
    ModelUse("reward", SEED_REWARD, "tiny"),
)
SEED_MODELS = (
    ModelUse("student", SEED_STUDENT, "hub", SEED_STUDENT, SEED_STUDENT_REVISION),
    ModelUse("reward", SEED_REWARD, "hub", SEED_REWARD, SEED_REWARD_REVISION),
)

# The H100 and H200 run what the release card runs (peak memory per process is held to the card's budget by the
# profile). The release card runs its workloads one after another.
_CUDA_FULL = Scale(
    name="full",
    description="CUDA: the embedded SmolLM2-135M with NF4 LoRA where a workload trains NF4, 2 prompts x 8 samples x "
    "32 new tokens per cycle (direct-config: the native verl YAML's own 2 x 4 x 32, unquantized), the "
    "preregistered matrix on the embedded SmolLM2",
    set_overrides=("models.device=cuda",),
    quantization="nf4",
    prompts_per_cycle=2,
    samples_per_prompt=8,
    max_new_tokens=32,
    matrix_model="smollm2-135m-instruct",
    policy_refreshes=8,
    models=STAND_INS,
)

# A dedicated 80-141 GiB card holds every workload's processes at once (each well under the 14.5 GiB budget), so
# the same sizes run side by side there, the timed speed pairs alone first: the same work, about half the wall time.
_DEDICATED_GPU = replace(
    _CUDA_FULL,
    description=_CUDA_FULL.description + "; the workloads side by side, the timed rollout bench alone first",
    side_by_side=True,
)

SCALES: dict[str, Scale] = {
    "cpu-reference": Scale(
        name="reduced",
        description="CI on 2 CPU cores: the embedded SmolLM2-135M in fp32, 2 prompts x 4 samples x 16 new tokens "
        "per cycle (GRPO workloads at least 32, see harness/qualify/full/runs.py; direct-config runs the native "
        "verl YAML's own 2 x 4 x 32, which plan --verl-config never resizes), no quantization (NF4 needs CUDA), the "
        "preregistered matrix on the tiny model",
        set_overrides=("models.device=cpu",),
        quantization=None,
        prompts_per_cycle=2,
        samples_per_prompt=4,
        max_new_tokens=16,
        matrix_model="tiny",
        policy_refreshes=8,
        models=STAND_INS,
    ),
    "h100-cu130": _DEDICATED_GPU,
    "h200-cu130": _DEDICATED_GPU,
    # The release card has a network: grpo-cycles and the v0.13 workload train the seed's Qwen3-0.6B and score with
    # its DistilBERT reward model, fetched at their pinned revisions (the preregistered matrix stays on SmolLM2).
    "rtx4080-wsl2-cu130": replace(
        _CUDA_FULL,
        description=_CUDA_FULL.description.replace(
            "the embedded SmolLM2-135M with NF4 LoRA where a workload trains NF4",
            "SmolLM2-135M, but Qwen3-0.6B (NF4 LoRA for GRPO) with the DistilBERT SST-2 reward model in "
            "grpo-cycles and ppo-rm-handoff",
        ),
        models=SEED_MODELS,
    ),
}
