#!/usr/bin/env bash
# H200, 2026-12-01: the full qualification (issue 11) on the h200-cu130 profile, on a candidate built here.
# One call carries at most 64 MiB (working tree included), so the GGUF travels in two parts over
# back-to-back calls: (1) .carry/h1 (its first 63,000,000 bytes) -> /tmp/p1, (2) .carry/h2 (the rest) -> /tmp/p2,
# (3) this script with .carry/bnb, .whl, out/candidate, .carry/git.tar and .carry/verl-cp312 (two calls' worth:
#     carry ray.part.aa in one call and copy it to /tmp first if the 64 MiB limit is reached). The harness runs in its own session (setsid), so a later call can
#   wait for it past one call's limit: `bash scripts/device/h200_full_20261201.sh wait`.
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/res
if [ "${1:-start}" = "start" ]; then
  rm -rf $res; mkdir -p $res
  mkdir -p .git && tar xf .carry/git.tar -C .git && git config core.fileMode false
  git status --short | head -5; git log -1 --format=%H | tee $res/commit.txt
  cat /tmp/p1 /tmp/p2 > /tmp/smol.gguf
  echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /tmp/smol.gguf" | sha256sum -c || exit 1
  mkdir -p /tmp/whl && cp .carry/bnb/*.whl .whl/*.whl /tmp/whl/ || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
  MINIVERL_CACHE=/tmp/miniverl-cache python3 -m miniverl models fetch smollm2-135m-instruct --gguf /tmp/smol.gguf >/dev/null
  # verl 0.9.1 for the handoff diagnosis, from the cp312 wheels in .carry/verl-cp312 (ray split in two parts),
  # in its own venv over the image's packages (its transformers 5.17 is too new for verl). Not yet tried there.
  verl_args=()
  if [ -d .carry/verl-cp312 ]; then
    (cd .carry/verl-cp312 && cat ray.part.* > ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl && sha256sum -c ray.sha256) && \
    python3 -m venv --system-site-packages /tmp/verl-venv && \
      /tmp/verl-venv/bin/python -m pip install -q --no-index --no-deps .carry/verl-cp312/*.whl && \
      /tmp/verl-venv/bin/python -c "import verl, ray, hydra, tensordict; print('verl', verl.__version__)" && \
      verl_args=(--verl-python /tmp/verl-venv/bin/python)
  fi
  cp -r . /tmp/checkout   # the harness checks the worktree it runs from; keep a copy that outlives this call
  cd /tmp/checkout
  setsid bash -c "PYTHONPATH=/tmp/site:/tmp/checkout; export PYTHONPATH; /usr/bin/time -v python3 -m harness full \
    --profile h200-cu130 --candidate out/candidate --system-site-packages --offline-wheels /tmp/whl \
    --model-cache /tmp/miniverl-cache --out $res/qual --work /tmp/fullwork --keep-work ${verl_args[*]:-} > $res/full.log 2>&1; \
    echo \$? > $res/rc" < /dev/null > /dev/null 2>&1 &
  cd - >/dev/null
fi
limit=${WAIT_S:-520}
for _ in $(seq 1 "$limit"); do [ -f $res/rc ] && break; sleep 1; done
tail -25 $res/full.log
if [ -f $res/rc ]; then
  echo "harness full rc=$(cat $res/rc)"
  cd /tmp/checkout
  kg=known-good/h200-cu130.json
  PYTHONPATH=/tmp/site:/tmp/checkout python3 scripts/validate_release_chain.py --candidate-dir out/candidate \
    --candidate-manifest out/candidate/candidate-manifest.json --qualification $res/qual/qualification.json \
    --commit "$(cat $res/commit.txt)" --known-good-sha256 "$(sha256sum $kg | cut -d' ' -f1)" --known-good $kg \
    --required-gpu-name "NVIDIA H200" --level full_qualification --out $res/release-verification.json
  echo "auditor rc=$?"
  tar czf $OUT/results.tgz -C $res .
else
  echo "still running"
fi
