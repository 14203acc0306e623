#!/usr/bin/env bash
# H200, 2026-12-01: the reward-model role's `placement: offload` measured against `resident` (issue 9).
# 1. the CUDA test tests/integration/test_reward_model_offload_cuda.py (tiny models: the RM is on the CPU
#    before and after each scoring phase, and the resident run holds ~ its bytes more between phases);
# 2. PPO on the Qwen3-0.6B shape (random weights from its config, NF4, shared backbone: actor LoRA + critic
#    LoRA and value head), 2 cycles = 2 actor + 2 critic updates, rule reward + a reward model: a random
#    Qwen3ForSequenceClassification of ~126 M parameters (~0.47 GiB in fp32, the dtype the RM is loaded in)
#    built from a config and saved to a local directory (models.reward: {source: local, path: ...}).
#    Run twice, identical but for models.reward.placement: offload, then resident. Reports each run's peak
#    reserved/allocated and what stays allocated between phases (update_start_allocated_bytes, the RM's bytes
#    on the device after its phase), and the resident - offload differences, in $OUT/report.txt.
# Carry: .whl (pydantic & co), .carry/bnb (bitsandbytes). About 2 minutes on an H200.
# CPU check of the same commands (no carry, tiny shapes, device cpu, no NF4, no pytest):
#   RMOFF_CPU=1 PYTHON=/path/to/venv/python OUT=/tmp/rmoff-out bash scripts/device/h200_rm_offload_20261201.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cpu=${RMOFF_CPU:-0}
py=${PYTHON:-python3}
res=/tmp/rmoff; rm -rf $res; mkdir -p $res/work "$OUT"
if [ "$cpu" = 1 ]; then
  export PYTHONPATH=$PWD MINIVERL_CACHE=${MINIVERL_CACHE:-/tmp/miniverl-cache}
  device=cpu; quant=none; dtype=float32; limit=""; new_tokens=8
else
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl .carry/bnb/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
  device=cuda; quant=nf4; dtype=float32; limit="memory: {max_peak_reserved_gib: 14.5}"; new_tokens=64
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $res/gpu.txt
  timeout 150 "$py" -m pytest -q -p no:cacheprovider -m gpu tests/integration/test_reward_model_offload_cuda.py \
    > $res/pytest-gpu.txt 2>&1
  echo "pytest gpu rc=$?"; tail -3 $res/pytest-gpu.txt
fi
RMOFF_CPU=$cpu "$py" - <<'PY' || exit 1
import os

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, Qwen3Config

from tests.helpers.tiny import make_tiny_tokenizer

cpu = os.environ["RMOFF_CPU"] == "1"
tokenizer = make_tiny_tokenizer()
if cpu:  # tiny shapes: the same commands, in seconds
    policy = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128)
    reward = dict(policy, num_hidden_layers=4)
else:  # Qwen3-0.6B's shape; the RM: the same width, 8 layers
    policy = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=3072)
    reward = dict(policy, num_hidden_layers=8)
common = dict(tie_word_embeddings=True, max_position_embeddings=4096, pad_token_id=tokenizer.pad_token_id)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(Qwen3Config(vocab_size=151936, **policy, **common), dtype=torch.bfloat16)
model.save_pretrained("/tmp/rmoff-policy")
tokenizer.save_pretrained("/tmp/rmoff-policy")
print("policy params", sum(p.numel() for p in model.parameters()))
del model
torch.manual_seed(1)
rm = AutoModelForSequenceClassification.from_config(
    Qwen3Config(vocab_size=len(tokenizer), num_labels=1, **reward, **common), dtype=torch.float32
)
rm.save_pretrained("/tmp/rmoff-rm")
tokenizer.save_pretrained("/tmp/rmoff-rm")
n = sum(p.numel() for p in rm.parameters())
print("reward model params", n, f"({n * 4 / 2**30:.3f} GiB fp32)")
PY
cd $res/work
"$py" -m miniverl data sample --task calculator --rows 8 --seed 0 --out prompts.parquet --json > /dev/null || exit 1
for placement in offload resident; do
  cat > rm-$placement.yaml <<YAML
run: {name: rm-$placement, seed: 0}
models:
  runtime: shared_backbone
  device: $device
  dtype: $dtype
  student:
    source: local
    path: /tmp/rmoff-policy
    quantization: $quant
    lora: {enabled: true, r: 16, alpha: 32, dropout: 0.0}
  critic: {source: student}
  reward: {source: local, path: /tmp/rmoff-rm, placement: $placement, batch_size: 8, max_length: 256}
data: {path: prompts.parquet}
rollout: {prompts_per_cycle: 2, samples_per_prompt: 4, max_new_tokens: $new_tokens}
algorithm:
  name: ppo
  ppo: {gamma: 1.0, lam: 0.95, ppo_epochs: 1, mini_batches: 1, critic_learning_rate: 1.0e-4}
  rewards:
    - {name: target_length, weight: 1.0, params: {target_tokens: 32}}
    - {name: reward_model, weight: 0.5}
train: {cycles: 2, learning_rate: 1.0e-4, trajectory_batch_size: 4}
checkpoint: {every_updates: 1, keep_last: 1}
$limit
YAML
  "$py" -m miniverl plan rm-$placement.yaml --out plan-$placement.json --json > $res/plan-$placement.json \
    || { echo "plan $placement failed"; cat $res/plan-$placement.json; continue; }
  timeout 150 "$py" -m miniverl run --plan plan-$placement.json --output runs --run-id $placement --json --quiet \
    > $res/run-$placement.json 2> $res/run-$placement.err; echo "run $placement rc=$?"; tail -2 $res/run-$placement.err
  cp runs/$placement/summary.json $res/summary-$placement.json 2>/dev/null
  cp runs/$placement/metrics.jsonl $res/metrics-$placement.jsonl 2>/dev/null
done
cd - > /dev/null
"$py" - "$res" <<'PY' | tee "$OUT/report.txt"
import json
import sys
from pathlib import Path

res = Path(sys.argv[1])
GIB = 2**30


def gib(x):
    return "n/a" if x is None else f"{x / GIB:.3f} GiB ({int(x):,} B)"


runs = {}
for placement in ("offload", "resident"):
    try:
        summary = json.loads((res / f"summary-{placement}.json").read_text())
        lines = [json.loads(x) for x in (res / f"metrics-{placement}.jsonl").read_text().splitlines()]
    except (OSError, ValueError) as exc:
        print(f"{placement}: no results ({exc})")
        continue
    runs[placement] = (summary, lines)
    cuda = summary.get("cuda") or {}
    print(f"== {placement}: {summary['status']}, {summary['updates']} updates, device {summary['device']}, "
          f"{summary['wall_seconds']:.1f} s")
    print(f"  run peak reserved  {gib(cuda.get('peak_reserved_bytes'))}")
    print(f"  run peak allocated {gib(cuda.get('peak_allocated_bytes'))}")
    print(f"  teardown: baseline {cuda.get('baseline_allocated_bytes')} B, final {cuda.get('final_allocated_bytes')} B, "
          f"returned {cuda.get('teardown_returned_to_baseline')}")
    for line in lines:
        m = line["algorithm_metrics"]
        print(f"  cycle {line['cycle']}: peak reserved {gib(line['peak_reserved_bytes'])}, peak allocated "
              f"{gib(line['peak_allocated_bytes'])}, allocated at update start "
              f"{gib(line.get('update_start_allocated_bytes'))}")
        print(f"    RM {gib(m.get('reward_model/bytes'))}, on the device after its phase "
              f"{gib(m.get('reward_model/device_bytes_after_phase'))}, transfers {m.get('reward_model/transfers')}, "
              f"offloaded_after_phase {m.get('reward_model/offloaded_after_phase')}, "
              f"RM score mean {m.get('reward_model/mean'):.4f} std {m.get('reward_model/std'):.4f}")
if len(runs) == 2:
    (so, lo), (sr, lr) = runs["offload"], runs["resident"]
    rm = int(lo[0]["algorithm_metrics"]["reward_model/bytes"])
    print(f"== resident - offload (RM {gib(rm)})")
    for key in ("peak_reserved_bytes", "peak_allocated_bytes"):
        a, b = (so.get("cuda") or {}).get(key), (sr.get("cuda") or {}).get(key)
        print(f"  run {key}: " + ("n/a" if a is None or b is None else f"{(b - a) / GIB:+.3f} GiB ({b - a:+,} B)"))
    for a, b in zip(lo, lr):
        for key in ("peak_reserved_bytes", "peak_allocated_bytes", "update_start_allocated_bytes"):
            x, y = a.get(key), b.get(key)
            diff = "n/a" if x is None or y is None else f"{(y - x) / GIB:+.3f} GiB ({y - x:+,} B, {(y - x) / rm:.3f} x RM)"
            print(f"  cycle {a['cycle']} {key}: {diff}")
PY
cp $res/pytest-gpu.txt "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C $res --exclude work .
