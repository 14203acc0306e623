#!/usr/bin/env bash
# H200 rollout call: the rollout benchmark on the Qwen3-0.6B shape (batch 16 and 64, 256 fixed new
# tokens), then the rollout tests (CUDA ones included). Run from a copy of the perf worktree that
# carries .whl/ (pydantic, pydantic_core, annotated_types, typing_inspection: the H200 image has none).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
timeout 290 python3 -m miniverl.bench.rollout --model qwen3-0.6b-shape --device cuda --batches 16,64 \
  --new-tokens 256 --paths fast,fast_eager,hf_loop,hf_generate,fast_compiled,trl --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -25 "$OUT/bench.log"
timeout 85 python3 -m pytest -q -p no:cacheprovider -s tests/integration/test_rollout_cuda.py \
  tests/unit/test_rollout_fast.py tests/unit/test_rollout_hf.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|error|diff" "$OUT/pytest.log" | tail -8
