#!/usr/bin/env bash
# H200 call 4: join the SmolLM2 GGUF (first half parked by call 3), then on the real model:
# the h200-cu130 stack record + release smoke through the harness, the runtime in bf16 and NF4 on
# CUDA, and the equivalence gate. Carry: .whl, .carry/gguf_b, out/candidate, .git.
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/res4; rm -rf $res; mkdir -p $res
cat /tmp/part_aa .carry/gguf_b/part_ab > /tmp/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/smol.gguf" | sha256sum -c || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD MINIVERL_CACHE=/tmp/miniverl-cache
git stash push -u -q 2>/dev/null; git status --short | head -5; git log -1 --format=%H
python3 -m miniverl models fetch smollm2-135m-instruct --gguf /tmp/smol.gguf --json | tee $res/fetch.json
timeout 90 python3 -m harness stack record --profile h200-cu130 --candidate out/candidate --system-site-packages \
  --offline-wheels .whl --known-good-dir $res/known-good > $res/stack.log 2>&1; echo "stack record rc=$?"; tail -2 $res/stack.log
timeout 200 python3 -m harness smoke --profile h200-cu130 --candidate out/candidate --system-site-packages \
  --offline-wheels .whl --known-good-dir $res/known-good --model-cache /tmp/miniverl-cache --out $res/qual > $res/smoke.log 2>&1
echo "harness smoke rc=$?"; tail -4 $res/smoke.log
mkdir -p /tmp/rt && cd /tmp/rt && python3 -m miniverl data sample --task calculator --rows 16 --out prompts.parquet >/dev/null
for variant in bf16 nf4; do for algo in opd grpo; do
  sets=(--set models.device=cuda)
  [ $variant = bf16 ] && sets+=(--set models.dtype=bfloat16)
  [ $variant = nf4 ] && sets+=(--set models.student.quantization=nf4)
  [ $variant = nf4 ] && [ $algo = opd ] && sets+=(--set models.teacher.quantization=nf4)
  python3 -m miniverl plan "$OLDPWD/examples/$algo-smollm2.yaml" --out plan.json "${sets[@]}" --set train.cycles=2 >/dev/null &&
  timeout 50 python3 -m miniverl run --plan plan.json --output runs --run-id $variant-$algo --json > $res/run-$variant-$algo.json 2>$res/run-$variant-$algo.err
  echo "run $variant $algo rc=$?"; tail -1 $res/run-$variant-$algo.err
  cp runs/$variant-$algo/metrics.jsonl $res/metrics-$variant-$algo.jsonl 2>/dev/null
done; done
python3 -m miniverl export runs/nf4-grpo --out /tmp/rt/adapter-nf4 --json > $res/export-nf4.json 2>&1; echo "export nf4 rc=$?"
cd "$OLDPWD"
timeout 70 python3 -m miniverl.gate.equivalence --model smollm2 --device cuda --out $res/gate-smollm2.json > $res/gate-smollm2.log 2>&1
echo "gate smollm2 rc=$?"
tar czf $OUT/results.tgz -C $res .
