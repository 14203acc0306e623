#!/usr/bin/env bash
# H200, 2026-12-03 (issue 21): the decode kernels (split-K GEMM, tensor-core attention), the GRPO step against TRL
# under TRL's own peak memory, the update, the CUDA tests. Random weights built from each model's config (nothing
# downloaded). Carry [".carry/perf"] (pydantic & co, trl 1.16.0, datasets, dill, multiprocess) in every call:
#   bash scripts/device/h200_perf_20261203.sh kernels-grpo   # kernel timings, decode ms/step by graph replay,
#                                                            # bench grpo (SmolLM2 16 x 256) with the lean path's
#                                                            # budget = TRL's measured peak
#   bash scripts/device/h200_perf_20261203.sh tests-rollout  # CUDA tests (kernels compiled), bench rollout
#                                                            # (Qwen3-0.6B + LoRA r16, batch 16 and 64)
#   bash scripts/device/h200_perf_20261203.sh grpo-update    # bench grpo again (final code), the lean path at
#                                                            # 1.3 GiB too, bench update (Qwen3-0.6B, 8 x 512)
#   bash scripts/device/h200_perf_20261203.sh final          # what ran, with the device time left: the CUDA
#                                                            # tests but NF4's, then bench grpo as kernels-grpo
#   bash scripts/device/h200_perf_20261203.sh release COMMIT # 2026-12-04: what rebuilding a released rollout engine
#                                                            # costs, then final, on the code that releases it
#                                                            # between rollouts (COMMIT: what ran)
#   bash scripts/device/h200_perf_20261203.sh cuda-tests COMMIT  # every CUDA test, NF4's included: carry
#                                                            # [".carry/perf", ".carry/bnb"] (bitsandbytes 0.50.2)
# Every step has its own timeout and its log under $OUT; a failed step is reported and the next one runs.
set -uo pipefail
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .carry/perf/whl/*.whl $(ls .carry/bnb/*.whl 2>/dev/null) || { echo "perf FAILED: wheels"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
step() {  # NAME SECONDS CMD...: run with a timeout, output to $OUT/NAME.log, one status line
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 )) s"
}
case "${1:-}" in
kernels-grpo)
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
  git log -1 --format=%H | tee -a "$OUT/gpu.txt"
  python3 -c "import torch, transformers, peft, trl, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
  step attention-timing 60 python3 scripts/device/decode_attention_timing.py --json "$OUT/attention-timing.json"
  cat "$OUT/attention-timing.log"
  step gemm-timing 60 python3 scripts/device/decode_kernel_timing.py
  cat "$OUT/gemm-timing.log"
  step decode-profile 90 python3 scripts/device/h200_profile_20261203.py decode --out "$OUT/decode-profile"
  grep "graph replay" "$OUT/decode-profile.log"
  step grpo-smollm2 260 python3 -m miniverl bench grpo --model smollm2-shape --device cuda --prompts 2 --samples 8 \
    --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 5 --paths miniverl_fast,miniverl_lean,trl \
    --update-paths "" --memory-budget-gib trl --out "$OUT/grpo-smollm2"
  grep -E "memory|^\| (step|miniverl|trl|GRPO)" "$OUT/grpo-smollm2.log" | cut -c1-220 | head -24 ;;
tests-rollout)
  git -C . log -1 --format=%H 2>/dev/null | tee "$OUT/commit.txt"
  step cuda-tests 240 python3 -m pytest -q -p no:cacheprovider tests/integration/test_rollout_cuda.py \
    tests/integration/test_reward_model_offload_cuda.py tests/integration/test_gpu_training.py \
    tests/integration/test_policy_digest.py tests/integration/test_memory_plan_training.py \
    tests/unit/test_rollout_kernels.py tests/unit/test_rollout_gemm_kernels.py \
    tests/unit/test_rollout_attention_kernel.py tests/unit/test_adapter_precision.py tests/unit/test_memory_plan.py \
    tests/unit/test_algorithms_logprobs.py
  tail -4 "$OUT/cuda-tests.log"
  step rollout-qwen3 200 python3 -m miniverl bench rollout --model qwen3-0.6b-shape --device cuda --batches 16,64 \
    --new-tokens 256 --paths fast,fast_triton --repeats 5 --pair fast_triton,fast --pairs 5 --out "$OUT/rollout-qwen3"
  grep -E "^\| (fast|batch|decode|path)|ratio|met" "$OUT/rollout-qwen3.log" | cut -c1-200 | head -30 ;;
grpo-update)
  step grpo-smollm2 260 python3 -m miniverl bench grpo --model smollm2-shape --device cuda --prompts 2 --samples 8 \
    --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 5 --paths miniverl_fast,miniverl_lean,trl \
    --update-paths "" --memory-budget-gib trl --out "$OUT/grpo-smollm2"
  grep -E "memory|^\| (step|miniverl|trl|GRPO)" "$OUT/grpo-smollm2.log" | cut -c1-220 | head -24
  step grpo-smollm2-lean-1.3 90 python3 -m miniverl bench grpo --model smollm2-shape --device cuda --prompts 2 \
    --samples 8 --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 5 --paths miniverl_lean --update-paths "" \
    --memory-budget-gib 1.3 --out "$OUT/grpo-smollm2-lean-1.3"
  grep -E "memory|^\| step" "$OUT/grpo-smollm2-lean-1.3.log" | cut -c1-220 | head -6
  step update-qwen3 90 python3 -m miniverl bench grpo --model qwen3-0.6b-shape --device cuda --paths "" \
    --update-paths naive_hf_peft,miniverl_update,miniverl_update_bf16 --update-shape 8,512 --warmup 1 --repeats 5 \
    --out "$OUT/update-qwen3"
  step update-qwen3-ckpt4 90 python3 -m miniverl bench grpo --model qwen3-0.6b-shape --device cuda --paths "" \
    --update-paths naive_hf_peft,miniverl_update_bf16 --update-shape 8,512 --warmup 1 --repeats 5 \
    --activation-checkpointing 4 --out "$OUT/update-qwen3-ckpt4"
  grep -hE "memory:|^\| (naive|miniverl|update)" "$OUT"/update-qwen3*.log | cut -c1-200 | head -20 ;;
cuda-tests)
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit ${2:-unknown}"
    python3 -c "import torch, transformers, peft, bitsandbytes, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'bitsandbytes', bitsandbytes.__version__, 'triton', triton.__version__)"
  } | tee "$OUT/gpu.txt"
  step cuda-tests 400 python3 -m pytest -q -p no:cacheprovider -rfEs tests/integration/test_rollout_cuda.py \
    tests/integration/test_gpu_training.py tests/integration/test_policy_digest.py \
    tests/integration/test_memory_plan_training.py tests/integration/test_reward_model_offload_cuda.py \
    tests/unit/test_rollout_kernels.py tests/unit/test_rollout_gemm_kernels.py \
    tests/unit/test_rollout_attention_kernel.py tests/unit/test_adapter_precision.py tests/unit/test_models_loading.py
  tail -6 "$OUT/cuda-tests.log" ;;
release)
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit ${2:-unknown}"
    python3 -c "import torch, transformers, peft, trl, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'triton', triton.__version__)"
  } | tee "$OUT/gpu.txt"
  step rollout-rebuild 120 python3 scripts/device/rollout_rebuild_timing.py --json "$OUT/rollout-rebuild.json"
  grep -E "^(fold|workspace|capture|rollout)" "$OUT/rollout-rebuild.log" | cut -c1-160
  set -- final ;&
final)  # one call on the final code, when little device time is left: the CUDA tests (NF4 cases need the
        # bitsandbytes wheel, not carried here), then the GRPO step against TRL under TRL's peak
  step cuda-tests 230 python3 -m pytest -q -p no:cacheprovider -k "not nf4" tests/integration/test_rollout_cuda.py \
    tests/integration/test_gpu_training.py tests/integration/test_policy_digest.py \
    tests/integration/test_memory_plan_training.py tests/integration/test_reward_model_offload_cuda.py \
    tests/unit/test_rollout_kernels.py tests/unit/test_rollout_gemm_kernels.py \
    tests/unit/test_rollout_attention_kernel.py tests/unit/test_adapter_precision.py
  tail -4 "$OUT/cuda-tests.log"
  step grpo-smollm2 240 python3 -m miniverl bench grpo --model smollm2-shape --device cuda --prompts 2 --samples 8 \
    --new-tokens 256 --rollout-batch 16 --warmup 1 --repeats 5 --paths miniverl_fast,miniverl_lean,trl \
    --update-paths "" --memory-budget-gib trl --out "$OUT/grpo-smollm2"
  grep -E "memory|^\| (step|miniverl|trl|GRPO)" "$OUT/grpo-smollm2.log" | cut -c1-220 | head -24 ;;
*) echo "usage: $0 kernels-grpo | tests-rollout | grpo-update | final | release COMMIT | cuda-tests COMMIT"; exit 2 ;;
esac
