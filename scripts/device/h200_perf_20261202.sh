#!/usr/bin/env bash
# H200, 2026-12-02 (issue 21): the CUDA tests and the equal-work benchmarks, on random weights built from each
# model's config (nothing downloaded). Carry [".carry/perf"] (pydantic & co, trl 1.16.0, datasets 5.2.0, dill,
# multiprocess: the image lacks them) in every call; two calls, back to back:
#   bash scripts/device/h200_perf_20261202.sh tests-grpo   # CUDA tests (kernels compiled), bench grpo (SmolLM2
#                                                          # step vs TRL; Qwen3-0.6B update vs naive HF+PEFT)
#   bash scripts/device/h200_perf_20261202.sh rollout      # bench rollout, Qwen3-0.6B shape + LoRA r16, batch 16, 64
# and, carrying [".carry/perf", ".carry/perf-nf4"] (the bitsandbytes 0.50.2 wheel the first call lacked):
#   bash scripts/device/h200_perf_20261202.sh nf4-tests    # tests/integration/test_gpu_training.py, NF4 cases too
# Every step has its own timeout and its log under $OUT; a failed step is reported and the next one runs.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .carry/perf/whl/*.whl || { echo "perf FAILED: wheels"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
step() {  # NAME SECONDS CMD...: run with a timeout, output to $OUT/NAME.log, one status line
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s"
}
case "${1:-}" in
tests-grpo)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch, transformers, peft, trl, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
  step cuda-tests 200 python3 -m pytest -q -p no:cacheprovider tests/integration/test_rollout_cuda.py \
    tests/integration/test_reward_model_offload_cuda.py tests/integration/test_gpu_training.py \
    tests/integration/test_policy_digest.py tests/integration/test_memory_plan_training.py \
    tests/unit/test_rollout_kernels.py tests/unit/test_adapter_precision.py tests/unit/test_memory_plan.py
  tail -3 "$OUT/cuda-tests.log"
  step grpo-smollm2 200 python3 -m miniverl bench grpo --model smollm2-shape --device cuda --prompts 2 --samples 8 \
    --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 5 --paths miniverl_fast,miniverl_lean,trl \
    --update-paths "" --memory-budget-gib 1.2 --out "$OUT/grpo-smollm2"
  grep -E "^\| (miniverl|trl|step|GRPO)" "$OUT/grpo-smollm2.log" | head -12
  step update-qwen3 90 python3 -m miniverl bench grpo --model qwen3-0.6b-shape --device cuda --paths "" \
    --update-paths naive_hf_peft,miniverl_update,miniverl_update_bf16 --update-shape 8,512 --warmup 1 --repeats 5 \
    --out "$OUT/update-qwen3"
  step update-qwen3-ckpt 90 python3 -m miniverl bench grpo --model qwen3-0.6b-shape --device cuda --paths "" \
    --update-paths naive_hf_peft,miniverl_update_bf16 --update-shape 8,512 --warmup 1 --repeats 5 \
    --activation-checkpointing 1 --out "$OUT/update-qwen3-ckpt"
  grep -hE "^\| (naive|miniverl)" "$OUT"/update-qwen3*.log | head -8 ;;
rollout)
  step rollout-qwen3 470 python3 -m miniverl bench rollout --model qwen3-0.6b-shape --device cuda --batches 16,64 \
    --new-tokens 256 --paths fast,fast_triton,hf_generate,hf_generate_static --repeats 5 --slow-repeats 5 \
    --pairs 5 --out "$OUT/rollout-qwen3"
  tail -30 "$OUT/rollout-qwen3.log" ;;
nf4-tests)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .carry/perf-nf4/*.whl || { echo "perf FAILED: bitsandbytes wheel"; exit 1; }
  step gpu-training-tests 200 python3 -m pytest -q -p no:cacheprovider tests/integration/test_gpu_training.py
  tail -3 "$OUT/gpu-training-tests.log" ;;
*) echo "usage: $0 tests-grpo | rollout | nf4-tests"; exit 2 ;;
esac
