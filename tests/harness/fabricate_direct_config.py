"""FABRICATED evidence for the direct-config judge, until a real capture of the 2-epoch x 2-mini-batch workload exists.

The direct-config workload now runs native GRPO and PPO files with repeated passes, which needs the ``multipass``
and ``nativeppo`` branches before any CLI can produce its evidence. Until a real capture exists its judge is tested
on evidence derived here from the last *real* cpu-reference capture (``full_fixtures/direct-config-1pass/``: the
one-pass GRPO workload), by stating what the new runs will record: each config's files under its own folder; the
native files (``harness/workloads/verl-native-grpo-2x2.yaml``, ``verl-native-ppo.yaml``) and their sha256
wherever a record names the native file; the pass counts in the plans, native diffs and metrics lines; a PPO
plan/handoff/diagnose (compiler v2, ``gae``, a critic); and the critic's two safetensors files in both PPO
checkpoints (same digests in the product's checkpoint.json and the harness's state-hashes.json, bound as the
harness binds them). Nothing here ran.

``python tests/harness/fabricate_direct_config.py`` rewrites ``full_fixtures/direct-config/``; a test holds the
committed copy to this script's output. Replace both with a real capture (``python -m harness workload
direct-config ...``) and delete this file and ``direct-config-1pass/``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1])]

from harness.full import direct_config as dc  # noqa: E402
from harness.full import walkthrough as wt  # noqa: E402

SOURCE = HERE / "full_fixtures" / "direct-config-1pass" / "v015" / "direct-config"
DEST = HERE / "full_fixtures" / "direct-config"
ONE_PASS_ROLES = {  # the one-pass workload's roles that are gone
    "plan_native_ppo",
    "plan_ppo_epochs_2",
    "plan_mini_batches_2",
}
PPO_IR = hashlib.sha256(b"fabricated: the PPO bundle's IR").hexdigest()
PPO_RULES = hashlib.sha256(b"fabricated: compiler v2 rules").hexdigest()
CRITIC_FILES = {  # name -> (bytes, sha256) of a fabricated critic LoRA + value head and its AdamW state
    "critic_params.safetensors": (3720184, hashlib.sha256(b"fabricated critic params").hexdigest()),
    "critic_optimizer.safetensors": (7434512, hashlib.sha256(b"fabricated critic optimizer").hexdigest()),
}


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _dump(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _counts(c: dc.Config, step: int) -> dict[str, float]:
    """What a line of the 2 x 2 run records: the pass counts, and a clip that acts (fabricated figures)."""
    out = {
        "actor/updates": float(dc.ACTOR_EPOCHS * dc.ACTOR_MINI_BATCHES),
        "actor/passes": float(dc.ACTOR_EPOCHS),
        "actor/mini_batches": float(dc.ACTOR_MINI_BATCHES),
        "actor/pg_clipfrac": 0.03125 * step,
        "actor/ppo_kl": 0.0009765625 * step,
    }
    if c.critic:
        out |= {
            "critic/updates": float(dc.CRITIC_EPOCHS * dc.CRITIC_MINI_BATCHES),
            "critic/passes": float(dc.CRITIC_EPOCHS),
            "critic/mini_batches": float(dc.CRITIC_MINI_BATCHES),
            "critic/delta_norm": 0.0078125 * step,
            "critic/vf_loss": 0.25 / step,
        }
    return out


def _metrics(c: dc.Config, source: Path, dest: Path) -> None:
    lines = [json.loads(x) for x in source.read_text().splitlines()]
    for line in lines:
        line["algorithm"] = c.algorithm
        line["algorithm_metrics"] |= _counts(c, line["step"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))


def _algorithm(doc: dict[str, Any], c: dc.Config) -> None:
    for holder in (doc, doc.get("summary") or {}):
        if "algorithm" in holder:
            holder["algorithm"] = c.algorithm


def _handoff_ids(doc: dict[str, Any], c: dc.Config) -> None:
    if c.critic:
        doc.update(compiler=wt.VERL_COMPILER_PPO, ir_digest=PPO_IR, rules_digest=PPO_RULES)


def fabricate(dest: Path = DEST) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    old_sha = _load(SOURCE / "native-sha256.json")["sha256_before"]
    root = dest / dc.FOLDER
    for name in ("diagnose-environment.json",):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SOURCE / name, root / name)
    hashes = _load(SOURCE / "state-hashes.json")
    new_hashes: dict[str, Any] = {**hashes, "checkpoints": {}}
    transcript = _load(SOURCE / "transcript.json")
    invocations = []
    for c in dc.CONFIGS:
        native = (dc.INPUTS / c.native).read_bytes()
        sha = hashlib.sha256(native).hexdigest()
        base = root / c.key

        def path(role: str, base: Path = base) -> Path:
            return base / dc.PER_CONFIG[role]

        def source(role: str) -> Path:
            return SOURCE / dc.PER_CONFIG[role]

        def text(role: str, c: dc.Config = c, sha: str = sha) -> Any:
            raw = source(role).read_text().replace(old_sha, sha)
            raw = raw.replace("verl-native-grpo.yaml", c.native).replace("verl-native-grpo-one-step.yaml", c.replay)
            raw = raw.replace('"runs/native"', f'"runs/{c.run_id}"')
            return json.loads(raw)

        _dump(path("native_sha256"), {"file": c.native, "sha256_after": sha, "sha256_before": sha})
        plan = text("plan")
        algorithm = plan["config"]["algorithm"]
        algorithm["name"] = c.algorithm
        if c.critic:
            algorithm["ppo"] |= {"ppo_epochs": dc.ACTOR_EPOCHS, "mini_batches": dc.ACTOR_MINI_BATCHES}
            algorithm["ppo"] |= {"critic_ppo_epochs": dc.CRITIC_EPOCHS, "critic_mini_batches": dc.CRITIC_MINI_BATCHES}
        else:
            algorithm["grpo"] |= {"ppo_epochs": dc.ACTOR_EPOCHS, "mini_batches": dc.ACTOR_MINI_BATCHES}
            algorithm["grpo"]["shuffle_mini_batches"] = True
        plan["direct_config"]["native"].update(text=native.decode(), sha256=sha)
        _handoff_ids(plan["handoff"], c)
        _dump(path("plan"), plan)
        plan_output = text("plan_output")
        _handoff_ids(plan_output["handoff"], c)
        _dump(path("plan_output"), plan_output)
        for role in ("run_output", "resume_output", "summary", "replay_first_output", "replay_summary"):
            doc = text(role)
            _algorithm(doc, c)
            _dump(path(role), doc)
        for role in ("inspect_2", "inspect_3"):
            doc = text(role)
            _algorithm(doc, c)
            doc["metrics_last"]["algorithm"] = c.algorithm
            doc["metrics_last"]["algorithm_metrics"] |= _counts(c, doc["metrics_last"]["step"])
            _dump(path(role), doc)
        _metrics(c, source("metrics"), path("metrics"))
        _metrics(c, source("replay_metrics"), path("replay_metrics"))
        diff = text("native_diff")
        for entry in diff["entries"]:
            value = {
                "actor_rollout_ref.actor.ppo_epochs": dc.ACTOR_EPOCHS,
                "actor_rollout_ref.actor.ppo_mini_batch_size": 1,
                "critic.enable": c.critic,
            }.get(entry["key"], entry["native"])
            entry.update(native=value, bundle=value)
        if c.critic:
            for key, value in (("critic.ppo_epochs", dc.CRITIC_EPOCHS), ("critic.ppo_mini_batch_size", 1)):
                diff["entries"].append({"bundle": value, "key": key, "native": value, "status": "same"})
            diff["entries"].sort(key=lambda e: e["key"])
            diff["counts"]["same"] += 2
        _dump(path("native_diff"), diff)
        path("bundle_native").write_bytes(native)
        manifest = text("bundle_manifest")
        _handoff_ids(manifest, c)
        _dump(path("bundle_manifest"), manifest)
        handoff = text("handoff")
        _handoff_ids(handoff, c)
        handoff["manifest_sha256"] = _sha(path("bundle_manifest"))
        _dump(path("handoff"), handoff)
        diagnose = text("diagnose")
        _handoff_ids(diagnose, c)
        if c.critic:
            diagnose["checks"]["validate_config"].update(adv_estimator="gae", use_critic=True)
        _dump(path("diagnose"), diagnose)
        for label in ("checkpoint_2", "replay_checkpoint_2"):
            listing = _load(source(label))
            entry = dict(hashes["checkpoints"][label])
            entry["files"] = dict(entry["files"])
            if c.critic:
                for name, (size, digest) in CRITIC_FILES.items():
                    listing["files"][name] = {"bytes": size, "sha256": digest}
                    entry["files"][name] = {"bytes": size, "sha256": digest}
            _dump(path(label), listing)
            entry["checkpoint_json_sha256"] = _sha(path(label))
            new_hashes["checkpoints"][c.role(label)] = entry
        renames = {
            "verl-native-grpo.yaml": c.native,
            "verl-native-grpo-one-step.yaml": c.replay,
            "plan.json": f"plan-{c.key}.json",
            "plan-replay.json": f"plan-{c.key}-replay.json",
            "native": c.run_id,
            "replay": c.replay_id,
            "runs/native": f"runs/{c.run_id}",
            "bundle": f"bundle-{c.key}",
        }
        for inv in transcript["invocations"]:
            if inv["step"] not in ONE_PASS_ROLES:
                argv = [renames.get(arg, arg) for arg in inv["argv"]]
                invocations.append({**inv, "step": c.step(inv["step"]), "argv": argv})
    _dump(root / "state-hashes.json", new_hashes)
    _dump(root / "transcript.json", {**transcript, "invocations": invocations})
    return dest


if __name__ == "__main__":
    print("wrote", fabricate())
