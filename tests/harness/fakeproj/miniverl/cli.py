"""Canned answers to the CLI contract, shaped like the real runtime's outputs.

FAKE_MINIVERL_FAIL=<step> makes that step fail (exit 1).
FAKE_MINIVERL_BAD=<name>[,<name>...] makes one concrete value per name bad while the step still
exits 0, so the harness has to read the value to notice (names in BAD_VALUES below).
"""

import hashlib
import json
import os
import sys
from pathlib import Path

from miniverl import __version__

BAD_VALUES = {
    "version": "`--version` prints another version",
    "doctor_verdict": "doctor: the cpu_training verdict is not ok",
    "model_identity": "models fetch: empty identity",
    "model_name": "models fetch: another model's name",
    "data_sha": "data sample: the reported sha256 is not the file's",
    "data_rows": "data sample: one row fewer than asked",
    "plan_digest": "plan (OPD): the reported plan_digest is not the plan file's",
    "grpo_plan_data": "plan (GRPO): data_sha256 is not the sampled file's",
    "dry_run_status": "run --dry-run: status `planned`",
    "opd_cycles": "run (OPD): summary cycles 0",
    "teacher_kl": "run (OPD): metrics kl 0 (teacher equal to the student)",
    "response_tokens": "run (OPD): metrics response_tokens 0",
    "teacher_role": "run (OPD): run.json has no teacher role",
    "metrics_nan": "run (OPD): metrics kl written as NaN",
    "opd_delta": "run (OPD): metrics adapter_delta_norm 0",
    "metrics_lines": "run (OPD): one metrics line more than the summary's updates",
    "inspect_updates": "inspect: updates differ from the run's summary",
    "reload_diff": "export: reload max |logit diff| above tolerance (still claims passed)",
    "reload_manifest": "export: manifest_sha256 is not the written manifest's",
    "reload_tolerance": "export: reports a tolerance of 1.0 and a diff of 0.5 (claims passed)",
    "grpo_std": "run (GRPO): reward_std_within_group_max 0",
    "grpo_adv": "run (GRPO): nonzero_advantages 0",
    "grpo_delta": "run (GRPO): adapter_delta_norm 0",
}


def _bad():
    names = {n.strip() for n in os.environ.get("FAKE_MINIVERL_BAD", "").split(",") if n.strip()}
    unknown = names - set(BAD_VALUES)
    if unknown:
        raise SystemExit(f"miniverl: error: unknown FAKE_MINIVERL_BAD names {sorted(unknown)}")
    return names


def _out(value):
    print(json.dumps(value, sort_keys=True))


def _write(path, data):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _canonical(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _metrics_line(step, algorithm, bad):
    opd, grpo = algorithm == "opd", algorithm == "grpo"
    line = {
        "step": step,
        "cycle": step,
        "policy_version": step - 1,
        "algorithm": algorithm,
        "loss": 0.5,
        "reward_mean": 0.25,
        "reward_std": 0.25,
        "reward_std_within_group_max": 0.0 if grpo and "grpo_std" in bad else 0.25,
        "nonzero_advantages": (0 if "grpo_adv" in bad else 4) if grpo else None,
        "kl": (0.0 if "teacher_kl" in bad else float("nan") if "metrics_nan" in bad else 0.125) if opd else None,
        "grad_norm": 1.0,
        "adapter_delta_norm": 0.0 if (opd and "opd_delta" in bad) or (grpo and "grpo_delta" in bad) else 0.01,
        "response_tokens": 0 if opd and "response_tokens" in bad else 32,
        "trajectories": 2 if opd else 4,
        "rollout_seconds": 0.5,
        "update_seconds": 0.5,
        "cycle_seconds": 1.0,
        "peak_reserved_bytes": None,
        "peak_allocated_bytes": None,
    }
    return json.dumps(line, sort_keys=True)  # NaN stays a NaN literal, as a careless writer would leave it


def _run(args, bad):
    plan_path, run_id = args[args.index("--plan") + 1], args[args.index("--run-id") + 1]
    plan = json.loads(Path(plan_path).read_text())
    run_dir = Path(args[args.index("--output") + 1]) / run_id
    if "--dry-run" in args:
        status = "planned" if "dry_run_status" in bad else "dry_run_ok"
        _out({"run_dir": str(run_dir), "status": status, "plan_digest": plan["plan_digest"], "updates": 1, "rows": 8})
        return 0
    algorithm = plan["algorithm"]
    opd = algorithm == "opd"
    _write(run_dir / "plan.json", Path(plan_path).read_bytes())
    roles = {"student": {"adapter_name": "student", "base": {"gguf_sha256": "ab" * 32}}}
    if opd and "teacher_role" not in bad:
        roles["teacher"] = {"base": {"gguf_sha256": "ab" * 32}, "physical_model": "teacher"}
    manifest = {"run_id": run_id, "algorithm": algorithm, "roles": {"runtime": "dual_model", "roles": roles}}
    _write(run_dir / "run.json", json.dumps(manifest).encode())
    updates = 1
    steps = updates + (1 if opd and "metrics_lines" in bad else 0)
    lines = [_metrics_line(step, algorithm, bad) for step in range(1, steps + 1)]
    _write(run_dir / "metrics.jsonl", "".join(line + "\n" for line in lines).encode())
    parsed = [json.loads(line) for line in lines[:updates]]
    summary = {  # derived from the metrics, as the runtime's entry does
        "status": "completed",
        "updates": updates,
        "cycles": 0 if opd and "opd_cycles" in bad else updates,
        "device": "cpu",
        "dtype": "float32",
        "algorithm": algorithm,
        "reward_mean": 0.25,
        "adapter_changed_each_update": all(m["adapter_delta_norm"] > 0 for m in parsed),
        "nonzero_advantages": sum(m["nonzero_advantages"] for m in parsed) if not opd else None,
        "reward_std_within_group_max": max(m["reward_std_within_group_max"] for m in parsed),
        "wall_seconds": 1.5,
        "seconds_per_cycle": 1.5,
        "cuda": None,
    }
    _write(run_dir / "summary.json", json.dumps(summary).encode())
    _out({"run_dir": str(run_dir), "status": "completed", "updates": updates, "cycles": 1, "summary": summary})
    return 0


def _plan(args, bad):
    config, out = Path(args[1]), args[args.index("--out") + 1]
    text = config.read_text()
    algorithm = "opd" if "name: opd" in text else "grpo"
    data = Path("data/prompts.parquet")
    data_sha = hashlib.sha256(data.read_bytes()).hexdigest() if data.is_file() else None
    if algorithm == "grpo" and "grpo_plan_data" in bad:
        data_sha = "0" * 64
    body = {
        "algorithm": algorithm,
        "config_digest": hashlib.sha256(text.encode()).hexdigest(),
        "data": {"path": str(data), "sha256": data_sha},
        "overrides": [args[i + 1] for i, a in enumerate(args) if a == "--set"],
    }
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    _write(out, _canonical({**body, "plan_digest": digest}))
    reported = hashlib.sha256(digest.encode()).hexdigest() if algorithm == "opd" and "plan_digest" in bad else digest
    _out(
        {
            "plan_digest": reported,
            "path": out,
            "config_digest": body["config_digest"],
            "data_sha256": data_sha,
            "models": {},
        }
    )
    return 0


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    bad = _bad()
    if args == ["--version"]:
        print(__version__ + ("+other" if "version" in bad else ""))
        return 0
    step = " ".join(a for a in args[:2] if not a.startswith("-"))
    if os.environ.get("FAKE_MINIVERL_FAIL") and os.environ["FAKE_MINIVERL_FAIL"] in step:
        print(f"miniverl: error: {step} failed on purpose", file=sys.stderr)
        return 1
    cmd = args[0]
    if cmd == "doctor":
        _out(
            {
                "versions": {"python": "3", "miniverl": __version__, "torch": None, "cuda": None},
                "devices": [],
                "gpu_name": None,
                "capabilities": {
                    "cpu_training": {"verdict": "unavailable" if "doctor_verdict" in bad else "ok", "reason": ""},
                    "gpu_training": {"verdict": "unavailable", "reason": "no CUDA"},
                    "nf4": {"verdict": "unavailable", "reason": "no CUDA"},
                },
            }
        )
    elif cmd == "models":
        identity = {} if "model_identity" in bad else {"gguf_sha256": "ab" * 32, "name": args[2], "source": "builtin"}
        name = "another-model" if "model_name" in bad else args[2]
        _out({"name": name, "path": "cache/models/" + args[2], "identity": identity})
    elif cmd == "data":
        out, rows = args[args.index("--out") + 1], int(args[args.index("--rows") + 1])
        rows -= 1 if "data_rows" in bad else 0
        sha = _write(out, b"PAR1" + bytes(rows) + b"PAR1")
        _out(
            {
                "path": out,
                "rows": rows,
                "sha256": hashlib.sha256(sha.encode()).hexdigest() if "data_sha" in bad else sha,
            }
        )
    elif cmd == "plan":
        return _plan(args, bad)
    elif cmd == "run":
        return _run(args, bad)
    elif cmd == "inspect":
        summary = json.loads((Path(args[1]) / "summary.json").read_text())
        updates = summary["updates"] + (1 if "inspect_updates" in bad else 0)
        _out({"run_id": Path(args[1]).name, "status": summary["status"], "updates": updates, "checkpoints": []})
    elif cmd == "export":
        out = Path(args[args.index("--out") + 1])
        _write(out / "adapter_config.json", b'{"r": 8}')
        _write(out / "adapter_model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        sha = _write(out / "miniverl-manifest.json", b'{"kind": "adapter"}')
        diff = 0.5 if "reload_diff" in bad or "reload_tolerance" in bad else 0.0
        tolerance = 1.0 if "reload_tolerance" in bad else 0.0001
        _out(
            {
                "out": str(out),
                "reload": {"max_abs_logit_diff": diff, "tolerance": tolerance, "passed": diff <= tolerance},
                "manifest_sha256": hashlib.sha256(sha.encode()).hexdigest() if "reload_manifest" in bad else sha,
            }
        )
    else:
        print(f"miniverl: error: unknown command {cmd}", file=sys.stderr)
        return 2
    return 0
