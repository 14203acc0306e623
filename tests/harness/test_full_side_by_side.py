"""Workloads side by side (a dedicated GPU's scale): every workload runs to a record, the timed rollout bench runs
alone before any other step, the others overlap, and each transcript keeps its declared order."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path

from harness.core.proc import Redactor
from harness.core.profiles import PROFILES
from harness.qualify.full.direct_config_layout import CONFIGS
from harness.qualify.full.product_workflows_layout import PRODUCT_WORKFLOW_INVOCATIONS
from harness.qualify.full.runner import RunnerOptions, run_workloads
from harness.qualify.full.scales import SCALES

# A stand-in for the installed CLI (named as such): it logs when it ran and exits 0 without doing any work.
FAKE_CLI = """
import json, os, sys, time
began = time.time()
time.sleep(0.05)
with open({log!r}, "a") as log:
    log.write(json.dumps([sys.argv[1:3], os.getcwd(), began, time.time()]) + "\\n")
print("{{}}")
"""


def test_side_by_side_runs_the_timed_step_alone_and_the_rest_together(tmp_path: Path) -> None:
    venv, log = tmp_path / "venv", tmp_path / "calls.jsonl"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "miniverl"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_CLI.format(log=str(log)))
    exe.chmod(0o755)
    data = tmp_path / "prompts.parquet"
    data.write_bytes(b"PAR1")
    profile = PROFILES["cpu-reference"]
    opts = RunnerOptions(
        venv=venv,
        root=tmp_path / "full",
        redact=Redactor({"work": tmp_path / "full", "venv": venv}),
        extra_env={},
        profile=profile,
        scale=replace(SCALES["cpu-reference"], side_by_side=True),
        data_source=data,
        model_wheel=None,
        verl_python=None,
        installed=None,
        wheel_sha256="0" * 64,
    )
    outcomes, missing = run_workloads(opts)
    assert not missing and [o.name for o in outcomes][:2] == ["direct-gkd", "pg-k1"] and len(outcomes) == 8
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    bench = [c for c in calls if c[0] == ["bench", "rollout"]]
    assert len(bench) == 1
    _, _, _bench_start, bench_end = bench[0]
    assert all(c[2] >= bench_end for c in calls if c is not bench[0]), "a step ran beside the timed bench"
    others = sorted((c for c in calls if c is not bench[0]), key=lambda c: c[2])
    overlapping = sum(1 for a, b in itertools.pairwise(others) if b[2] < a[3])
    assert overlapping >= 5, f"only {overlapping} steps overlapped"
    product = next(o for o in outcomes if o.name == "product-workflows")
    steps = [i["step"] for i in json.loads(product.files["transcript"][1].read_text())["invocations"]]
    assert steps == [s for s in PRODUCT_WORKFLOW_INVOCATIONS if not s.endswith("_diagnose")]
    direct = next(o for o in outcomes if o.name == "direct-config")
    keys = [i["step"].rsplit("_", 1)[-1] for i in json.loads(direct.files["transcript"][1].read_text())["invocations"]]
    assert keys == sorted(keys, key=[c.key for c in CONFIGS].index), "the configs' steps interleave in the transcript"
