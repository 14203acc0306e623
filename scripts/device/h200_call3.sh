#!/usr/bin/env bash
# H200 call 3: park the first half of the SmolLM2 GGUF in /tmp (call 4 must follow within the warm
# window), then the equivalence gate on the Qwen3-0.6B shape in NF4. Carry: .whl, .carry/gguf_a.
set -uo pipefail
export PYTHONUNBUFFERED=1
cp .carry/gguf_a/part_aa /tmp/part_aa && ls -la /tmp/part_aa
res=/tmp/res3; rm -rf $res; mkdir -p $res
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 120 python3 -m miniverl.gate.equivalence --model qwen3-0.6b-shape --device cuda --quantization nf4 \
  --out $res/gate-qwen3-shape-nf4.json > $res/gate-qwen3-nf4.log 2>&1; echo "gate qwen3 nf4 rc=$?"
grep -E '"status"|"observed"' $res/gate-qwen3-shape-nf4.json | head -14
tar czf $OUT/results.tgz -C $res .
