"""Native verl PPO and multi-pass GRPO YAMLs (compiler v4) end to end on a tiny model.

PPO: plan -> run -> inspect -> resume -> extend -> handoff. The file is ``examples/verl-native-ppo.yaml``
shrunk for the tiny model (sizes and reward only; its pass structure, critic and GAE settings as written):
2 epochs x 2 mini-batches for the actor, 1 x 2 for the critic. GRPO: ``examples/verl-native-grpo-2x2.yaml``
(2 epochs x 2 mini-batches) planned, run and handed off. Each metrics line records the optimizer steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from miniverl.canonical import sha256_file
from tests.integration.test_handoff import _no_local_paths

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "verl-native-ppo.yaml"


def _native_tiny(workdir: Path, example: Path = EXAMPLE) -> Path:
    native = yaml.safe_load(example.read_text())
    native["data"]["max_response_length"] = 6
    native["actor_rollout_ref"]["rollout"]["n"] = 2
    native["reward"]["custom_reward_function"]["reward_kwargs"]["miniverl_rewards"] = [
        {"name": "target_length", "weight": 1.0, "params": {"target_tokens": 3}}
    ]
    path = workdir / f"tiny-{example.name}"
    path.write_text(yaml.safe_dump(native, sort_keys=False))
    return path


def _counts(line: dict) -> dict[str, int]:
    metrics = line["algorithm_metrics"]
    return {k: int(v) for k, v in metrics.items() if k.split("/")[-1] in ("updates", "passes", "mini_batches")}


def test_native_ppo_plan_run_resume_handoff_round_trips(cli, tiny_model_dir, prompts, workdir: Path) -> None:
    native = _native_tiny(workdir)
    digest = sha256_file(native)
    planned = cli(
        "plan", "--verl-config", str(native), "--set", f"model={tiny_model_dir}", "--set", "device=cpu",
        "--out", "plan.json", "--json",
    )  # fmt: skip
    assert planned.code == 0, planned.err
    section = planned.json()["handoff"]
    assert (section["status"], section["compiler"], section["imported_by"]) == (
        "compiles",
        "verl-rl-v0.9-single-gpu-v2",
        "verl-rl-v0.9-single-gpu-v4",
    )
    config = json.loads(Path("plan.json").read_text())["config"]
    ppo = config["algorithm"]["ppo"]
    assert config["algorithm"]["name"] == "ppo" and config["models"]["critic"]["source"] == "student"
    assert (ppo["ppo_epochs"], ppo["mini_batches"], ppo["critic_ppo_epochs"], ppo["critic_mini_batches"]) == (
        2,
        2,
        1,
        2,
    )

    ran = cli("run", "--plan", "plan.json", "--run-id", "p", "--json")
    assert ran.code == 0, ran.err
    lines = [json.loads(line) for line in (workdir / "runs" / "p" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:  # verl: ppo_epochs x train_batch_size / ppo_mini_batch_size, actor and critic apart
        assert _counts(line) == {
            "actor/updates": 4, "actor/passes": 2, "actor/mini_batches": 2,
            "critic/updates": 2, "critic/passes": 1, "critic/mini_batches": 2,
        }  # fmt: skip
    report = cli("inspect", "runs/p", "--json").json()
    assert report["updates"] == 2 and report["status"] == "completed"
    assert report["direct_config"]["native_sha256"] == digest and report["direct_config"]["native_sha256_verified"]
    resumed = cli("run", "--plan", "plan.json", "--run-id", "p", "--resume", "--extend", "1", "--json")
    assert resumed.code == 0, resumed.err
    assert cli("inspect", "runs/p", "--json").json()["updates"] == 3

    handed = cli("handoff", "runs/p", "--out", "bundle", "--json")
    assert handed.code == 0, handed.err
    bundle = workdir / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["compiler"] == "verl-rl-v0.9-single-gpu-v2" and manifest["config_name"] == "miniverl_ppo"
    evidence = manifest["direct_config"]
    assert evidence["compiler"] == "verl-rl-v0.9-single-gpu-v4" and evidence["native_sha256"] == digest
    assert evidence["semantically_equal"] and (bundle / "critic_adapter" / "adapter_config.json").is_file()
    assert sha256_file(bundle / "native" / native.name) == digest
    diff = json.loads((bundle / "native-diff.json").read_text())
    statuses = {e["key"]: e["status"] for e in diff["entries"]}
    assert diff["semantically_equal"] and statuses["trainer.total_training_steps"] == "extended"
    for key in ("actor_rollout_ref.actor.ppo_epochs", "actor_rollout_ref.actor.ppo_mini_batch_size",
                "critic.ppo_epochs", "critic.ppo_mini_batch_size", "critic.cliprange_value", "critic.optim.lr",
                "critic.model.lora_rank", "critic.model.lora_alpha", "critic.model.target_modules",
                "algorithm.gamma", "algorithm.lam", "algorithm.adv_estimator"):  # fmt: skip
        assert statuses[key] == "same", key
    assert statuses["critic.model.lora_adapter_path"] == "runtime"  # the bundle's critic_adapter/ (value head)
    assert statuses["trainer.critic_warmup"] == "default"  # verl's own 0: the bundle leaves it out
    changed = {k: s for k, s in statuses.items() if s not in ("same", "runtime", "ignored", "default", "extended")}
    assert changed == {}
    assert sha256_file(native) == digest  # never edited
    _no_local_paths(bundle, workdir, tiny_model_dir)


def test_native_grpo_with_two_epochs_and_two_mini_batches_runs_and_round_trips(
    cli, tiny_model_dir, prompts, workdir: Path
) -> None:
    native = _native_tiny(workdir, EXAMPLES / "verl-native-grpo-2x2.yaml")
    digest = sha256_file(native)
    planned = cli(
        "plan", "--verl-config", str(native), "--set", f"model={tiny_model_dir}", "--set", "device=cpu",
        "--out", "plan.json", "--json",
    )  # fmt: skip
    assert planned.code == 0, planned.err
    assert planned.json()["handoff"]["compiler"] == "verl-rl-v0.9-single-gpu-v1"
    grpo = json.loads(Path("plan.json").read_text())["config"]["algorithm"]["grpo"]
    assert (grpo["ppo_epochs"], grpo["mini_batches"], grpo["shuffle_mini_batches"]) == (2, 2, True)
    ran = cli("run", "--plan", "plan.json", "--run-id", "g", "--json")
    assert ran.code == 0, ran.err
    lines = [json.loads(line) for line in (workdir / "runs" / "g" / "metrics.jsonl").read_text().splitlines()]
    assert [_counts(line) for line in lines] == [{"actor/updates": 4, "actor/passes": 2, "actor/mini_batches": 2}] * 2
    handed = cli("handoff", "plan.json", "--out", "bundle", "--json")
    assert handed.code == 0, handed.err
    diff = json.loads((workdir / "bundle" / "native-diff.json").read_text())
    statuses = {e["key"]: e["status"] for e in diff["entries"]}
    assert diff["semantically_equal"], [e for e in diff["entries"] if e["status"] in ("changed", "native_only")]
    for key in ("ppo_epochs", "ppo_mini_batch_size", "shuffle"):
        assert statuses[f"actor_rollout_ref.actor.{key}"] == "same", key
    assert sha256_file(native) == digest
