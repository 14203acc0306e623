#!/usr/bin/env bash
# H200, 2026-12-01: the release smoke with the strengthened checks (issue 7), run as three calls because
# one call carries at most 64 MiB: (1) GGUF part 1 -> /tmp, (2) GGUF part 2 + bitsandbytes -> /tmp,
# (3) this script with GGUF part 3, the small wheels, the candidate built here and the git metadata.
# Carry for (3): .carry/g3, .whl, out/candidate, .carry/git.tar.
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/res; rm -rf $res; mkdir -p $res
mkdir -p .git && tar xf .carry/git.tar -C .git && git config core.fileMode false
git status --short | head -5; git log -1 --format=%H
cat /tmp/p1 /tmp/p2 .carry/g3/p3 > /tmp/smol.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/smol.gguf" | sha256sum -c || exit 1
cp /tmp/whl/*.whl .whl/ || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
MINIVERL_CACHE=/tmp/miniverl-cache python3 -m miniverl models fetch smollm2-135m-instruct --gguf /tmp/smol.gguf >/dev/null
timeout 400 python3 -m harness smoke --profile h200-cu130 --candidate out/candidate --system-site-packages \
  --offline-wheels .whl --model-cache /tmp/miniverl-cache --out $res/qual > $res/smoke.log 2>&1
echo "harness smoke rc=$?"; tail -4 $res/smoke.log
kg=known-good/h200-cu130.json
python3 scripts/validate_release_chain.py --candidate-dir out/candidate \
  --candidate-manifest out/candidate/candidate-manifest.json --qualification $res/qual/qualification.json \
  --commit "$(git rev-parse HEAD)" --known-good-sha256 "$(sha256sum $kg | cut -d' ' -f1)" --known-good $kg \
  --required-gpu-name "NVIDIA H200" --level release_smoke --out $res/release-verification.json
echo "auditor rc=$?"
tar czf $OUT/results.tgz -C $res .
