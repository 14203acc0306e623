#!/usr/bin/env bash
# The runtime's smoke on the embedded SmolLM2: one real OPD cycle and one real GRPO cycle on
# whatever device is available, then export + PEFT reload. Usage: runtime_smoke.sh [WORKDIR] [--set ...]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"; shift || true
mkdir -p "$work"; cd "$work"
echo "runtime smoke in $work" >&2
miniverl --version
miniverl doctor
miniverl models fetch smollm2-135m-instruct ${MINIVERL_GGUF:+--gguf "$MINIVERL_GGUF"}
miniverl data sample --task calculator --rows 16 --seed 0 --out prompts.parquet
for algo in opd grpo; do
  miniverl plan "$repo/examples/$algo-smollm2.yaml" --out "plan-$algo.json" "$@"
  miniverl run --plan "plan-$algo.json" --dry-run --output runs --run-id "$algo"
  miniverl run --plan "plan-$algo.json" --output runs --run-id "$algo"
  miniverl inspect "runs/$algo"
  miniverl export "runs/$algo" --out "adapter-$algo"
done
echo "runtime smoke passed" >&2
