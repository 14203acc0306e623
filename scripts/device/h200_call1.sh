#!/usr/bin/env bash
# H200 call 1: environment probe, CUDA tests on tiny models, tiny gate on CUDA, the Qwen3-0.6B-shape
# benchmark (NF4 + fp32 compute, then bf16). Carry: .whl (bitsandbytes, gguf, pydantic wheels).
set -uo pipefail
export PYTHONUNBUFFERED=1
res=/tmp/res; rm -rf $res; mkdir -p $res
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $res/nvidia-smi.txt
python3 -c "import sys,torch,transformers,peft,bitsandbytes,pydantic; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__, pydantic.__version__)" | tee $res/versions.txt
python3 -m miniverl doctor --json > $res/doctor.json
timeout 200 python3 -m pytest -q -m gpu tests/integration/test_gpu_training.py -p no:cacheprovider 2>&1 | tail -25 | tee $res/pytest-gpu.txt
timeout 60 python3 -m miniverl gate equivalence --model tiny --device cuda --out $res/gate-tiny --json > $res/gate-tiny.stdout 2>&1; tail -c 600 $res/gate-tiny.stdout
for spec in "nf4 float32" "none bfloat16"; do set -- $spec
  timeout 170 python3 -m miniverl.bench.runtime --rows synthetic --model qwen3-0.6b-shape --device cuda --quantization $1 --dtype $2 --out $res/bench-$1-$2 > $res/bench-$1-$2.log 2>&1
  echo "bench $1 $2 rc=$?"; tail -5 $res/bench-$1-$2.log; cat $res/bench-$1-$2/bench.md 2>/dev/null
done
tar czf $OUT/results.tgz -C $res .
