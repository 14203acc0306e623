"""Canned answers to the CLI contract. FAKE_MINIVERL_FAIL=<step> makes that step fail (exit 1)."""

import hashlib
import json
import os
import sys
from pathlib import Path

from miniverl import __version__


def _out(value):
    print(json.dumps(value, sort_keys=True))


def _write(path, data):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        print(__version__)
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
                    "cpu_training": {"verdict": "ok", "reason": ""},
                    "gpu_training": {"verdict": "unavailable", "reason": "no CUDA"},
                    "nf4": {"verdict": "unavailable", "reason": "no CUDA"},
                },
            }
        )
    elif cmd == "models":
        _out({"name": args[2], "path": "cache/models/" + args[2], "identity": {"gguf_sha256": "ab" * 32}})
    elif cmd == "data":
        out, rows = args[args.index("--out") + 1], int(args[args.index("--rows") + 1])
        sha = _write(out, b"PAR1" + bytes(rows) + b"PAR1")
        _out({"path": out, "rows": rows, "sha256": sha})
    elif cmd == "plan":
        config, out = Path(args[1]), args[args.index("--out") + 1]
        text = config.read_text()
        algorithm = "opd" if "name: opd" in text else "grpo"
        plan = {
            "algorithm": algorithm,
            "config_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "overrides": [args[i + 1] for i, a in enumerate(args) if a == "--set"],
        }
        data = json.dumps(plan, sort_keys=True).encode()
        _write(out, data)
        _out(
            {
                "plan_digest": "sha256:" + hashlib.sha256(data).hexdigest(),
                "path": out,
                "config_digest": "sha256:" + plan["config_sha256"],
                "data_sha256": None,
                "models": {},
            }
        )
    elif cmd == "run":
        plan_path, run_id = args[args.index("--plan") + 1], args[args.index("--run-id") + 1]
        if "--dry-run" in args:
            _out({"run_dir": None, "status": "dry_run_ok", "updates": 0, "cycles": 0, "summary": {}})
            return 0
        plan = json.loads(Path(plan_path).read_text())
        run_dir = Path(args[args.index("--output") + 1]) / run_id
        _write(run_dir / "plan.json", Path(plan_path).read_bytes())
        roles = {"actor": "smollm2"} | ({"teacher": "smollm2+context"} if plan["algorithm"] == "opd" else {})
        _write(run_dir / "run.json", json.dumps({"run_id": run_id, "roles": roles}).encode())
        _write(run_dir / "metrics.jsonl", b'{"loss":0.5,"update":1}\n')
        summary = {
            "status": "completed",
            "updates": 1,
            "cycles": 1,
            "device": "cpu",
            "dtype": "float32",
            "algorithm": plan["algorithm"],
            "reward_mean": 0.25,
            "adapter_changed_each_update": True,
            "nonzero_advantages": 2,
            "reward_std_within_group_max": 0.25,
            "wall_seconds": 1.5,
            "seconds_per_cycle": 1.5,
            "cuda": None,
        }
        _write(run_dir / "summary.json", json.dumps(summary).encode())
        _out({"run_dir": str(run_dir), "status": "completed", "updates": 1, "cycles": 1, "summary": summary})
    elif cmd == "inspect":
        _out({"run_id": Path(args[1]).name, "status": "completed", "updates": 1, "checkpoints": [], "metrics_last": {}})
    elif cmd == "export":
        out = Path(args[args.index("--out") + 1])
        _write(out / "adapter_config.json", b'{"r": 8}')
        _write(out / "adapter_model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        sha = _write(out / "miniverl-manifest.json", b'{"kind": "adapter"}')
        _out(
            {
                "out": str(out),
                "reload": {"max_abs_logit_diff": 0.0, "tolerance": 0.0001, "passed": True},
                "manifest_sha256": sha,
            }
        )
    else:
        print(f"miniverl: error: unknown command {cmd}", file=sys.stderr)
        return 2
    return 0
