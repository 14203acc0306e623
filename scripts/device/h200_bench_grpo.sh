#!/usr/bin/env bash
# H200, 2026-12-01 (issue 12): `miniverl bench grpo` on the Qwen3-0.6B shape (GRPO step: miniverl fast,
# fast + bf16 adapter/fp32 masters, hf loop, TRL GRPOTrainer; update B=8 T=512: naive HF+PEFT vs miniverl
# fp32 and bf16+fp32-master), then on the SmolLM2-135M shape (step: fast, fast bf16, TRL), then the CUDA
# tests of the rollout engine and of the policy-refresh digests. Random weights from each config.
# Run from a copy of the s3-perf worktree that carries .whl/ (pydantic & co; trl 1.16.0, datasets, dill,
# multiprocess: the H200 image has none of them).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, transformers, peft, trl; print(torch.__version__, transformers.__version__, peft.__version__, trl.__version__, torch.cuda.get_device_name())" 2>&1 | tail -1
timeout 180 python3 -m miniverl bench grpo --model qwen3-0.6b-shape --device cuda --prompts 2 --samples 8 \
  --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 2 --update-shape 8,512 --out "$OUT/qwen3" > /tmp/qwen3.log 2>&1
echo "qwen3 rc=$?"; cat /tmp/qwen3.log >> "$OUT/bench.log"; grep -vE "^\{|kernels" /tmp/qwen3.log | tail -32
timeout 90 python3 -m miniverl bench grpo --model smollm2-shape --device cuda --prompts 2 --samples 8 \
  --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 2 --paths miniverl_fast,miniverl_fast_bf16,trl \
  --update-paths "" --out "$OUT/smollm2" > /tmp/smollm2.log 2>&1
echo "smollm2 rc=$?"; cat /tmp/smollm2.log >> "$OUT/bench.log"; grep -E "^\| step|^\| GRPO|^\| step_" /tmp/smollm2.log
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/integration/test_rollout_cuda.py \
  tests/integration/test_policy_digest.py -k "cuda" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error" "$OUT/pytest.log" | tail -5
