#!/usr/bin/env bash
# H200 call 5: the harness on the real SmolLM2 (first GGUF half parked in /tmp by the call before):
# record the h200-cu130 stack, then the release smoke against it. Carry: .whl, .carry/gguf_b,
# out/candidate, .carry/git.tar (the checkout's git metadata, for the clean-tree check).
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/res5; rm -rf $res; mkdir -p $res
mkdir -p .git && tar xf .carry/git.tar -C .git && git config core.fileMode false
git status --short | head -5; git log -1 --format=%H
cat /tmp/part_aa .carry/gguf_b/part_ab > /tmp/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/smol.gguf" | sha256sum -c || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
MINIVERL_CACHE=/tmp/miniverl-cache python3 -m miniverl models fetch smollm2-135m-instruct --gguf /tmp/smol.gguf >/dev/null
timeout 100 python3 -m harness stack record --profile h200-cu130 --candidate out/candidate --system-site-packages \
  --offline-wheels .whl --known-good-dir $res/known-good > $res/stack.log 2>&1; echo "stack record rc=$?"; tail -2 $res/stack.log
timeout 280 python3 -m harness smoke --profile h200-cu130 --candidate out/candidate --system-site-packages \
  --offline-wheels .whl --known-good-dir $res/known-good --model-cache /tmp/miniverl-cache --out $res/qual > $res/smoke.log 2>&1
echo "harness smoke rc=$?"; tail -4 $res/smoke.log
tar czf $OUT/results.tgz -C $res .
