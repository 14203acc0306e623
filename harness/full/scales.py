"""The sizes each profile runs the full workloads at. A reduced size is declared here, never applied silently;
the record names the scale it ran."""

from __future__ import annotations

from harness.full.base import Scale

SCALES: dict[str, Scale] = {
    "cpu-reference": Scale(
        name="reduced",
        description="CI on 2 CPU cores: the embedded SmolLM2-135M in fp32, 2 prompts x 4 samples x 16 new tokens "
        "per cycle, no quantization (NF4 needs CUDA), the preregistered matrix on the tiny model",
        set_overrides=("models.device=cpu",),
        quantization=None,
        prompts_per_cycle=2,
        samples_per_prompt=4,
        max_new_tokens=16,
        matrix_model="tiny",
        policy_refreshes=8,
    ),
    "h200-cu130": Scale(
        name="full",
        description="the H200: the embedded SmolLM2-135M with NF4 LoRA on CUDA, 2 prompts x 8 samples x 32 new "
        "tokens per cycle, the preregistered matrix on the embedded SmolLM2",
        set_overrides=("models.device=cuda",),
        quantization="nf4",
        prompts_per_cycle=2,
        samples_per_prompt=8,
        max_new_tokens=32,
        matrix_model="smollm2-135m-instruct",
        policy_refreshes=8,
    ),
    "rtx4080-wsl2-cu130": Scale(
        name="full",
        description="the release card: the embedded SmolLM2-135M with NF4 LoRA on CUDA, 2 prompts x 8 samples x 32 "
        "new tokens per cycle, the preregistered matrix on the embedded SmolLM2",
        set_overrides=("models.device=cuda",),
        quantization="nf4",
        prompts_per_cycle=2,
        samples_per_prompt=8,
        max_new_tokens=32,
        matrix_model="smollm2-135m-instruct",
        policy_refreshes=8,
    ),
}
