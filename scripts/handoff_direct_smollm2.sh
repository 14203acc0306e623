#!/usr/bin/env bash
# Direct-config evidence on the embedded SmolLM2-135M-Instruct (CPU), issue 10:
#   plan --verl-config examples/verl-native-grpo.yaml -> run 2 cycles -> inspect
#   -> run --resume --extend 1 (3 cycles) -> inspect -> handoff -> diagnose (in the verl 0.9.1 venv)
# with the native YAML's sha256 checked before and after every step (it must never change).
#
# Usage: scripts/handoff_direct_smollm2.sh [OUT_DIR]
#   OUT_DIR (default docs/measurements/2026-12-01-direct-config-smollm2) receives small JSON only.
#   MINIVERL (default .venv/bin/miniverl): the miniverl that plans, runs and hands off.
#   VERL_PYTHON (default .nox/verl_env/bin/python, built by `make verl-env`): verl's venv; this checkout's miniverl
#   runs in it from PYTHONPATH.
#   MINIVERL_CACHE: where SmolLM2 is cached (default .cache/miniverl when it exists).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${1:-$ROOT/docs/measurements/2026-12-01-direct-config-smollm2}" && cd "${1:-$ROOT/docs/measurements/2026-12-01-direct-config-smollm2}" && pwd)"
MINIVERL="${MINIVERL:-$ROOT/.venv/bin/miniverl}"
VERL_PYTHON="${VERL_PYTHON:-$ROOT/.nox/verl_env/bin/python}"
if [ -z "${MINIVERL_CACHE:-}" ] && [ -d "$ROOT/.cache/miniverl" ]; then
  export MINIVERL_CACHE="$ROOT/.cache/miniverl"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
NATIVE="$ROOT/examples/verl-native-grpo.yaml"
[ -x "$MINIVERL" ] || { echo "no miniverl at $MINIVERL" >&2; exit 2; }
[ -x "$VERL_PYTHON" ] || { echo "no verl venv at $VERL_PYTHON: run \`make verl-env\` first" >&2; exit 2; }

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
SHA0="$(sha256sum "$NATIVE" | cut -d' ' -f1)"
TIMES="$WORK/timings.jsonl"
: > "$TIMES"

check_native() {  # the native file is never edited
  local now
  now="$(sha256sum "$NATIVE" | cut -d' ' -f1)"
  if [ "$now" != "$SHA0" ]; then echo "native YAML changed after $1: $now != $SHA0" >&2; exit 1; fi
  printf '{"after":"%s","native_sha256":"%s"}\n' "$1" "$now" >> "$WORK/native-sha256.jsonl"
}

step() {  # step NAME CMD...: run CMD, keep its --json stdout as NAME.json, time it
  local name="$1"; shift
  local start end rc=0
  start="$(date +%s%N)"
  "$@" > "$OUT/$name.json" || rc=$?
  end="$(date +%s%N)"
  local tenths=$(( (end - start) / 100000000 ))
  printf '{"step":"%s","seconds":%d.%d,"exit":%s}\n' "$name" $(( tenths / 10 )) $(( tenths % 10 )) "$rc" >> "$TIMES"
  check_native "$name"
  if [ "$rc" -ne 0 ]; then echo "$name exited $rc" >&2; cat "$OUT/$name.json" >&2; exit 1; fi
}

check_native start
"$MINIVERL" data sample --task calculator --rows 16 --out prompts.parquet --json > "$OUT/data.json"
step plan "$MINIVERL" plan --verl-config "$NATIVE" --set model=smollm2-135m-instruct --set device=cpu \
  --set trajectory_batch_size=4 --out plan.json --json
step run-2-cycles "$MINIVERL" run --plan plan.json --run-id native --json --quiet
step inspect-2 "$MINIVERL" inspect runs/native --json
step resume-extend-1 "$MINIVERL" run --plan plan.json --run-id native --resume --extend 1 --json --quiet
step inspect-3 "$MINIVERL" inspect runs/native --json
step handoff "$MINIVERL" handoff runs/native --out bundle --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["direct_config"]["semantically_equal"] else "native-diff: not semantically equal")' "$OUT/handoff.json"
step diagnose env PYTHONPATH="$ROOT" "$VERL_PYTHON" -m miniverl diagnose bundle --json  # exit 0 only when launch_status is ready

cp bundle/manifest.json "$OUT/bundle-manifest.json"
cp bundle/native-diff.json "$OUT/native-diff.json"
cp runs/native/plan.json "$OUT/run-plan.json"
cp "$TIMES" "$OUT/timings.jsonl"
cp "$WORK/native-sha256.jsonl" "$OUT/native-sha256.jsonl"
sha256sum "$NATIVE" | sed "s#  $ROOT/#  #" > "$OUT/native.sha256"
echo "native sha256 $SHA0 unchanged through every step; outputs in $OUT"
