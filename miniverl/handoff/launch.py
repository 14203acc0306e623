"""The two executable files of a bundle: ``launch.sh`` and ``reward_fn.py`` (text templates)."""

from __future__ import annotations

import json
import shlex

from miniverl import __version__
from miniverl.handoff.emit import ADAPTER_DIR, MODEL_DIR
from miniverl.handoff.ir import ExperimentIR, PpoIR
from miniverl.handoff.reward_bridge import TOKENIZER_ENV

MODEL_ENV = "MINIVERL_MODEL_PATH"


def _model_resolution(ir: ExperimentIR) -> str:
    binding = ir.model
    if binding.binding == "hub":
        fetch = (
            "from huggingface_hub import snapshot_download; "
            f"print(snapshot_download({json.dumps(binding.model_id)}, revision={json.dumps(binding.revision)}))"
        )
        return f'MODEL_PATH="${{{MODEL_ENV}:-$(python -c {shlex.quote(fetch)})}}"'
    if binding.binding == "builtin":
        pick = 'import json, sys; print(json.load(sys.stdin)["path"])'
        name = shlex.quote(str(binding.model_id))
        fetch = f"python -m miniverl models fetch {name} --json | python -c {shlex.quote(pick)}"
        return f'MODEL_PATH="${{{MODEL_ENV}:-$({fetch})}}"'
    return f'MODEL_PATH="$HERE/{MODEL_DIR}"'


def _attention_fallback(ir: ExperimentIR) -> str:
    """verl loads the actor, reference and critic with flash_attention_2 unless told otherwise, and
    flash-attn is an optional package that verl's own install does not bring; without it the load
    fails, so launch.sh switches to PyTorch's SDPA there. Padding removal packs sequences for
    flash-attn's varlen kernel, so it goes off with it. Overrides after these (``"$@"``) win."""
    roles = ["actor_rollout_ref"] + (["critic"] if isinstance(ir.algorithm, PpoIR) else [])
    overrides = " ".join(
        f"++{role}.model.override_config.attn_implementation=sdpa {role}.model.use_remove_padding=false"
        for role in roles
    )
    return f"""ATTENTION=()
if ! python -c 'import flash_attn' >/dev/null 2>&1; then
  echo "launch.sh: flash-attn is not installed here: verl's models use PyTorch SDPA attention, no padding removal" >&2
  ATTENTION=({overrides})
fi
"""


# verl's LoRA rollout has vLLM load the base model from the checkpoint (rollout.load_format: safetensors); a
# directory without safetensors weights would only fail inside vLLM, minutes into the launch
WEIGHTS_CHECK = """if [ -d "$MODEL_PATH" ] && ! compgen -G "$MODEL_PATH/*.safetensors" >/dev/null; then
  echo "launch.sh: $MODEL_PATH has no *.safetensors weights; verl's LoRA rollout loads vLLM's base model from them \
(rollout.load_format: safetensors): save the model with save_pretrained(..., safe_serialization=True)" >&2
  exit 2
fi
"""


def launch_script(ir: ExperimentIR, config_name: str) -> str:
    adapter = (
        f'  actor_rollout_ref.model.lora_adapter_path="$HERE/{ADAPTER_DIR}" \\\n'
        if ir.lora.start_adapter == "bundle"
        else ""
    )
    critic = ""
    if isinstance(ir.algorithm, PpoIR):
        critic = (
            '  critic.model.path="$MODEL_PATH" \\\n'
            f'  critic.model.lora_adapter_path="$HERE/{ir.algorithm.critic.adapter_dir}" \\\n'
        )
    return f"""#!/usr/bin/env bash
# Written by miniverl {__version__} handoff ({ir.compiler}); runs verl {ir.verl_version} on this bundle.
# Needs an environment with verl {ir.verl_version} (vLLM rollout, one CUDA GPU) and miniverl (the reward code).
# {MODEL_ENV} overrides where the base model comes from. Extra arguments are Hydra overrides.
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
{_model_resolution(ir)}
{WEIGHTS_CHECK}export {TOKENIZER_ENV}="$MODEL_PATH"
cd "$HERE"
{_attention_fallback(ir)}exec python -m verl.trainer.main_ppo \\
  --config-path="$HERE/config" --config-name={config_name} \\
  actor_rollout_ref.model.path="$MODEL_PATH" \\
{critic}{adapter}  data.train_files="$HERE/{ir.data.train_file}" data.val_files="$HERE/{ir.data.train_file}" \\
  reward.custom_reward_function.path="$HERE/{ir.reward.function_file}" \\
  trainer.default_local_dir="$HERE/checkpoints" \\
  ${{ATTENTION[@]+"${{ATTENTION[@]}}"}} "$@"
"""


def reward_file(ir: ExperimentIR) -> str:
    terms = [t.model_dump(mode="json") for t in ir.reward.terms]
    model = ir.reward.reward_model
    rm = (
        "None"
        if model is None
        else f"json.loads({json.dumps(json.dumps(model.model_dump(mode='json'), sort_keys=True))})"
    )
    return f'''"""verl custom_reward_function written by miniverl {__version__} handoff ({ir.compiler}).

It calls miniverl's own reward code (miniverl.rewards.CompositeReward) with these terms, and
miniverl's RewardModel for the reward-model role (REWARD_MODEL) when the plan has one.
"""

import json

from miniverl.handoff.reward_bridge import score

TERMS = json.loads({json.dumps(json.dumps(terms, sort_keys=True))})
NEEDS_RESPONSE_TOKEN_COUNT = {ir.reward.needs_response_token_count!r}
REWARD_MODEL = {rm}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return score(
        TERMS, NEEDS_RESPONSE_TOKEN_COUNT, data_source, solution_str, ground_truth, extra_info, REWARD_MODEL
    )
'''
