#!/usr/bin/env bash
# H200, 2026-12-01: PPO (actor + critic, GAE) on the Qwen3-0.6B shape (random weights, built from its config)
# with NF4 weights, shared backbone (critic = second LoRA + value head), 2 cycles x 1 epoch x 1 mini-batch
# = 2 actor + 2 critic updates, rule reward. Then the same PPO run in bf16 (no NF4) for comparison.
# Carry: .whl (pydantic & co), .carry/bnb (bitsandbytes).
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/ppo; rm -rf $res; mkdir -p $res/work
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl .carry/bnb/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
python3 - <<'PY' || exit 1
import torch
from transformers import AutoModelForCausalLM, Qwen3Config
from tests.helpers.tiny import make_tiny_tokenizer
cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                  max_position_embeddings=4096)
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
model.save_pretrained("/tmp/qwen3-shape")
make_tiny_tokenizer().save_pretrained("/tmp/qwen3-shape")
print("params", sum(p.numel() for p in model.parameters()))
PY
cd $res/work
python3 -m miniverl data sample --task calculator --rows 8 --seed 0 --out prompts.parquet --json > /dev/null || exit 1
for variant in nf4 bf16; do
  if [ $variant = nf4 ]; then q=nf4; dt=float32; else q=none; dt=bfloat16; fi
  cat > ppo-$variant.yaml <<YAML
run: {name: ppo-qwen3-shape-$variant, seed: 0}
models:
  runtime: shared_backbone
  device: cuda
  dtype: $dt
  student:
    source: local
    path: /tmp/qwen3-shape
    quantization: $q
    lora: {enabled: true, r: 16, alpha: 32, dropout: 0.0}
  critic: {source: student}
data: {path: prompts.parquet}
rollout: {prompts_per_cycle: 2, samples_per_prompt: 4, max_new_tokens: 64}
algorithm:
  name: ppo
  ppo: {gamma: 1.0, lam: 0.95, ppo_epochs: 1, mini_batches: 1, critic_learning_rate: 1.0e-4}
  rewards:
    - {name: target_length, weight: 1.0, params: {target_tokens: 32}}
train: {cycles: 2, learning_rate: 1.0e-4, trajectory_batch_size: 4}
memory: {max_peak_reserved_gib: 14.5}
checkpoint: {every_updates: 1, keep_last: 2}
YAML
  python3 -m miniverl plan ppo-$variant.yaml --out plan-$variant.json --json > $res/plan-$variant.json || { echo "plan $variant failed"; cat $res/plan-$variant.json; continue; }
  timeout 400 python3 -m miniverl run --plan plan-$variant.json --output runs --run-id $variant --json --quiet \
    > $res/run-$variant.json 2> $res/run-$variant.err; echo "run $variant rc=$?"; tail -2 $res/run-$variant.err
  python3 -m miniverl inspect runs/$variant --json > $res/inspect-$variant.json 2>&1
  cp runs/$variant/summary.json $res/summary-$variant.json 2>/dev/null
  cp runs/$variant/metrics.jsonl $res/metrics-$variant.jsonl 2>/dev/null
done
tar czf $OUT/results.tgz -C $res --exclude work .
