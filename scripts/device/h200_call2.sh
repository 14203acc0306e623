#!/usr/bin/env bash
# H200 call 2: record the machine's real stack for the h200-cu130 profile, the bf16 benchmark and the
# equivalence gate on the Qwen3-0.6B shape. Carry: .whl, out/candidate.
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/res; rm -rf $res; mkdir -p $res
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 -m harness stack record --profile h200-cu130 --candidate out/candidate --system-site-packages \
  --offline-wheels .whl --known-good-dir $res/known-good > $res/stack-record.log 2>&1; echo "stack record rc=$?"; tail -3 $res/stack-record.log
timeout 280 python3 -m miniverl.bench.runtime --rows synthetic --model qwen3-0.6b-shape --device cuda --quantization none --dtype bfloat16 \
  --out $res/bench-none-bfloat16 > $res/bench-none-bfloat16.log 2>&1; echo "bench bf16 rc=$?"; cat $res/bench-none-bfloat16/bench.md 2>/dev/null || tail -20 $res/bench-none-bfloat16.log
timeout 150 python3 -m miniverl.gate.equivalence --model qwen3-0.6b-shape --device cuda --out $res/gate-qwen3-shape.json \
  > $res/gate-qwen3.log 2>&1; echo "gate qwen3 rc=$?"; tail -c 1500 $res/gate-qwen3.log
tar czf $OUT/results.tgz -C $res .
