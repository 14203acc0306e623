#!/bin/bash
# The README's first-run recipe at one commit, 1 torch thread, each command under /usr/bin/time -v.
# MINIVERL: how to run miniverl, e.g. "python -m miniverl" with PYTHONPATH at an export of the commit
# (`git archive COMMIT | tar -x -C snap`), or the installed `miniverl`.
set -eux
MINIVERL=${MINIVERL:-miniverl}
export OMP_NUM_THREADS=1
mkdir -p walk && cd walk
$MINIVERL init . --example grpo
$MINIVERL plan config.yaml --out plan.json
/usr/bin/time -v -o run.time $MINIVERL run --plan plan.json --output runs --run-id first --threads 1 2> run.stderr
/usr/bin/time -v -o eval.time $MINIVERL eval runs/first --data heldout.parquet --threads 1 --json > eval.json 2> eval.stderr
/usr/bin/time -v -o report.time $MINIVERL report runs/first > report.out 2>&1
/usr/bin/time -v -o export.time $MINIVERL export runs/first --out adapter > export.out 2>&1
