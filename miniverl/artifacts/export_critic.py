"""``miniverl export`` of a PPO run's critic: its own directory, verified by a real PEFT reload.

The trained critic (checkpoint ``critic_params.safetensors`` loaded into a fresh runtime) writes
``critic/`` (a standard PEFT adapter + ``value_head.safetensors``). Reload check: a fresh base +
``PeftModel.from_pretrained(critic/)`` + the saved head, through the model's own forward
(``output_hidden_states``), must give the trained critic's values on the probe within tolerance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.artifacts.reload import load_checkpoint_tensors, reload_peft
from miniverl.canonical import sha256_file
from miniverl.errors import ExportError
from miniverl.records import CheckpointFile, CriticExport, CriticReload

CRITIC_DIR = "critic"
VALUE_TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


def export_critic(
    config: Any, plan_models: dict[str, Any], ckpt_dir: Path, target: Path, probe: list[int]
) -> CriticExport:
    """Write ``target/critic`` and verify it; raise :class:`ExportError` when the reload differs."""
    critic_dir = target / CRITIC_DIR
    max_diff = _write_and_verify(config, ckpt_dir, critic_dir, probe)
    tolerance = VALUE_TOLERANCE[config.models.dtype]
    if max_diff > tolerance:
        raise ExportError(
            f"critic reload differs from the trained critic: max |value diff| {max_diff:.3g} > {tolerance:g}"
        )
    files = {
        f"{CRITIC_DIR}/{p.name}": CheckpointFile(sha256=sha256_file(p), bytes=p.stat().st_size)
        for p in sorted(critic_dir.iterdir())
        if p.is_file()
    }
    return CriticExport(
        directory=CRITIC_DIR,
        base_model=plan_models.get("critic", {}),
        files=files,
        reload=CriticReload(
            max_abs_value_diff=max_diff, tolerance=tolerance, passed=max_diff <= tolerance, probe_tokens=len(probe)
        ),
    )


def _write_and_verify(config: Any, ckpt_dir: Path, critic_dir: Path, probe: list[int]) -> float:
    import gc

    import torch
    from safetensors.torch import load_file

    from miniverl.models.loading import resolve_device
    from miniverl.runtime import build_runtime
    from miniverl.runtime.base import SequenceRows
    from miniverl.runtime.critic import VALUE_HEAD, values_from_hidden
    from miniverl.training.algorithms.ppo import CRITIC_PARAMS

    device = resolve_device(config.models.device)
    roles = config.models.model_copy(update={"runtime": "dual_model", "teacher": None, "reference": None})
    runtime = build_runtime(roles, device=device, critic_seed=config.algorithm.ppo.critic_head_seed)
    try:
        params = load_file(ckpt_dir / CRITIC_PARAMS)
        load_checkpoint_tensors(dict(runtime.named_critic_parameters()), params, ckpt_dir.name, "critic")
        runtime.save_critic(str(critic_dir))
        rows = SequenceRows(input_ids=(tuple(probe),), selected_positions=(tuple(range(len(probe))),))
        with runtime.use("critic") as critic, torch.no_grad():
            trained = values_from_hidden(runtime.value_head, critic.selected_hidden(rows, trajectory_batch_size=1))
        trained = trained.float().cpu()
    finally:
        runtime.close()
        del runtime
        gc.collect()
    reloaded = reload_peft(config, config.models.critic, critic_dir, device)
    head = load_file(critic_dir / VALUE_HEAD)
    with torch.no_grad():
        out = reloaded(input_ids=torch.tensor([probe], device=device), output_hidden_states=True)
        hidden = out.hidden_states[-1][0].float().cpu()
        again = hidden @ head["weight"].float().T.squeeze(-1) + head["bias"].float()
    del reloaded
    gc.collect()
    return float((trained - again).abs().max())
