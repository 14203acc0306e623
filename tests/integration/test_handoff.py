"""``miniverl handoff`` end to end on a tiny model (no verl needed): bundle contents, hashes, paths."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from miniverl.canonical import sha256_file
from tests.conftest import CliResult, tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _plan(cli: Callable[..., CliResult], write_config, config: dict) -> dict:
    write_config(config)
    result = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert result.code == 0, result.err
    return dict(result.json())


def _no_local_paths(bundle: Path, *forbidden: Path) -> None:
    """No file under ``bundle`` (or ``bundle`` itself, a file) holds one of the ``forbidden`` paths."""
    needles = [str(p) for p in forbidden] + [str(p.resolve()) for p in forbidden] + [str(Path.home())]
    for path in [bundle] if bundle.is_file() else bundle.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for needle in needles:
                assert needle.encode() not in data, f"{path} holds the local path {needle}"


def test_handoff_from_plan(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    planned = _plan(cli, write_config, tiny_config(tiny_model_dir))
    result = cli("handoff", "plan.json", "--out", "bundle", "--json")
    assert result.code == 0, result.err
    bundle = workdir / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["compiler"] == "verl-rl-v0.9-single-gpu-v1"
    assert manifest["ir_digest"] == result.json()["ir_digest"]
    handed = result.json()  # the keys the qualification harness reads
    assert {"bundle", "compiler", "ir_digest", "rules_digest", "manifest_sha256"} <= set(handed)
    assert handed["manifest_sha256"] == sha256_file(bundle / "manifest.json")
    # plan --json names the same compiler and digests the bundle records
    assert planned["handoff"] == {
        "status": "compiles",
        "compiler": manifest["compiler"],
        "imported_by": None,
        "ir_digest": manifest["ir_digest"],
        "rules_digest": manifest["rules_digest"],
        "refusal": None,
    }
    plan_digest = json.loads(Path("plan.json").read_text())["plan_digest"]
    assert manifest["source"] == {"kind": "plan", "plan_digest": plan_digest, "run_id": None, "checkpoint_step": None}
    assert manifest["model"]["binding"] == "bundle" and manifest["adapter"] is None
    assert manifest["model"]["dtype"] == "float32"
    carried = {"trained": "none", "handed_off": "none", "carried_over": True}
    assert manifest["quantization"] == handed["quantization"] == carried
    listed = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == listed
    for name, entry in manifest["files"].items():
        assert sha256_file(bundle / name) == entry["sha256"]
    assert {
        "config/miniverl_grpo.yaml",
        "data/train.parquet",
        "reward_fn.py",
        "launch.sh",
        "model/config.json",
    } <= listed
    _no_local_paths(bundle, workdir, tiny_model_dir)
    assert not [p for p in workdir.iterdir() if p.name.startswith(".tmp-handoff")]

    verl = yaml.safe_load((bundle / "config" / "miniverl_grpo.yaml").read_text())
    assert verl["defaults"] == ["ppo_trainer", "_self_"]
    assert set(verl) >= {"data", "actor_rollout_ref", "critic", "reward_model", "algorithm", "trainer"}
    assert verl["actor_rollout_ref"]["rollout"]["n"] == 2 and verl["algorithm"]["adv_estimator"] == "grpo"

    table = pq.read_table(bundle / "data" / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = table.slice(0, 1).to_pylist()[0]
    assert row["prompt"][0]["role"] == "user" and row["data_source"] == "miniverl/calculator"
    assert row["reward_model"]["ground_truth"] and row["extra_info"]["prompt_id"]


def test_reward_file_matches_miniverl(cli, write_config, tiny_model_dir, prompts, workdir: Path, monkeypatch) -> None:
    config = tiny_config(tiny_model_dir)
    config["algorithm"]["rewards"] = [
        {"name": "calculator_exact", "weight": 1.0},
        {"name": "target_length", "weight": 0.5, "params": {"target_tokens": 3}},
    ]
    _plan(cli, write_config, config)
    assert cli("handoff", "plan.json", "--out", "bundle").code == 0
    spec = importlib.util.spec_from_file_location("bundle_reward", workdir / "bundle" / "reward_fn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = pq.read_table(workdir / "bundle" / "data" / "train.parquet").slice(0, 1).to_pylist()[0]
    answer = row["reward_model"]["ground_truth"]
    monkeypatch.delenv("MINIVERL_HANDOFF_TOKENIZER", raising=False)
    with pytest.raises(Exception, match="MINIVERL_HANDOFF_TOKENIZER"):
        module.compute_score(row["data_source"], answer, answer, row["extra_info"])
    monkeypatch.setenv("MINIVERL_HANDOFF_TOKENIZER", str(workdir / "bundle" / "model"))
    from transformers import AutoTokenizer

    from miniverl.rewards import CompositeReward

    tokens = len(
        AutoTokenizer.from_pretrained(str(tiny_model_dir)).encode(f"It is {answer}.", add_special_tokens=False)
    )
    expected = CompositeReward([("calculator_exact", 1.0, {}), ("target_length", 0.5, {"target_tokens": 3})])(
        row["extra_info"]["prompt"], f"It is {answer}.", answer=answer, context=row["extra_info"]["context"],
        task="calculator", prompt_id=row["extra_info"]["prompt_id"], response_token_count=tokens,
    )  # fmt: skip
    assert module.compute_score(row["data_source"], f"It is {answer}.", answer, row["extra_info"]) == expected


def test_handoff_is_deterministic_and_never_overwrites(cli, write_config, tiny_model_dir, prompts, workdir) -> None:
    _plan(cli, write_config, tiny_config(tiny_model_dir))
    first = cli("handoff", "plan.json", "--out", "a", "--json").json()
    second = cli("handoff", "plan.json", "--out", "b", "--json").json()
    assert (first["ir_digest"], first["rules_digest"]) == (second["ir_digest"], second["rules_digest"])
    a, b = (json.loads((workdir / d / "manifest.json").read_text())["files"] for d in ("a", "b"))
    assert a == b
    again = cli("handoff", "plan.json", "--out", "a")
    assert again.code == 2 and again.err.count("\n") == 1 and "already exists" in again.err
    assert json.loads((workdir / "a" / "manifest.json").read_text())["files"] == a


def test_refusal_leaves_nothing(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir)
    config["algorithm"]["grpo"] = {"eps": 1e-3}
    section = _plan(cli, write_config, config)["handoff"]  # plan names the refusal up front
    assert (section["status"], section["compiler"], section["refusal"]["code"]) == (
        "refused", "verl-rl-v0.9-single-gpu-v1", "grpo_eps",
    )  # fmt: skip
    assert section["ir_digest"] is None and len(section["rules_digest"]) == 64
    human = cli("plan", "config.yaml", "--out", "plan2.json")
    assert "notice: the plan is valid and runs here; only a verl handoff is unavailable for it " in human.out
    assert "(grpo_eps, verl-rl-v0.9-single-gpu-v1: algorithm.grpo" in human.out and "refused" not in human.out
    result = cli("handoff", "plan.json", "--out", "bundle")
    assert result.code == 2
    assert result.err.startswith("miniverl: error: handoff refused (grpo_eps)") and result.err.count("\n") == 1
    assert not (workdir / "bundle").exists()
    assert not [p for p in workdir.iterdir() if p.name.startswith(".tmp-handoff")]


def test_bad_source_is_one_line(cli, workdir: Path) -> None:
    result = cli("handoff", "nope.json", "--out", "bundle")
    assert result.code == 2 and "neither a plan.json nor a run directory" in result.err


def test_handoff_from_run_carries_the_adapter(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir)
    config["train"]["cycles"] = 1
    _plan(cli, write_config, config)
    assert cli("run", "--plan", "plan.json", "--run-id", "r", "--json").code == 0
    result = cli("handoff", "runs/r", "--out", "bundle", "--json")
    assert result.code == 0, result.err
    bundle = workdir / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "run" and manifest["source"]["run_id"] == "r"
    assert manifest["source"]["checkpoint_step"] == manifest["adapter"]["checkpoint_step"] == 1
    assert manifest["adapter"]["reload_max_abs_logit_diff"] <= manifest["adapter"]["reload_tolerance"]
    assert {"adapter/adapter_model.safetensors", "adapter/adapter_config.json"} <= set(manifest["files"])
    adapter_config = json.loads((bundle / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == "model"
    verl = yaml.safe_load((bundle / "config" / "miniverl_grpo.yaml").read_text())
    assert verl["actor_rollout_ref"]["model"]["lora_adapter_path"] == "adapter"
    assert 'lora_adapter_path="$HERE/adapter"' in (bundle / "launch.sh").read_text()
    _no_local_paths(bundle, workdir, tiny_model_dir)


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_diagnose_without_verl_exits_2(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    _plan(cli, write_config, tiny_config(tiny_model_dir))
    assert cli("handoff", "plan.json", "--out", "bundle").code == 0
    result = cli("diagnose", "bundle")
    assert result.code == 2 and "verl is not installed" in result.err and result.err.count("\n") == 1


@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash-attn", "no-flash-attn"])
def test_launch_script_runs_verl_main_ppo_with_the_bundle(
    cli, write_config, tiny_model_dir, prompts, workdir, flash_attn: bool
) -> None:
    """launch.sh through a stand-in `python` on PATH that records its arguments (no verl, no GPU); where
    `import flash_attn` fails, verl's models are told to use SDPA without padding removal, before the user's
    overrides."""
    import os
    import subprocess

    _plan(cli, write_config, tiny_config(tiny_model_dir))
    assert cli("handoff", "plan.json", "--out", "bundle").code == 0
    fake = workdir / "bin"
    fake.mkdir()
    probe = "" if flash_attn else 'if [ "$1" = -c ]; then exit 1; fi\n'
    (fake / "python").write_text(f'#!/bin/sh\n{probe}printf "%s\\n" "$PWD" "$MINIVERL_HANDOFF_TOKENIZER" "$@"\n')
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "launch.sh", "trainer.n_gpus_per_node=8"], cwd=workdir / "bundle", env=env,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    here = str((workdir / "bundle").resolve())
    cwd, tokenizer, *argv = done.stdout.splitlines()
    assert cwd == here and tokenizer == f"{here}/model"
    assert argv[:4] == ["-m", "verl.trainer.main_ppo", f"--config-path={here}/config", "--config-name=miniverl_grpo"]
    assert f"actor_rollout_ref.model.path={here}/model" in argv
    assert f"data.train_files={here}/data/train.parquet" in argv
    assert f"reward.custom_reward_function.path={here}/reward_fn.py" in argv
    assert argv[-1] == "trainer.n_gpus_per_node=8"
    fallback = [
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.use_remove_padding=false",
    ]
    if flash_attn:
        assert not set(fallback) & set(argv)
    else:
        assert argv[-3:-1] == fallback  # before the user's own overrides
    assert ("flash-attn is not installed" in done.stderr) is not flash_attn


def _bin_only_copy(model_dir: Path, target: Path) -> Path:
    """The model directory with its weights as pytorch_model.bin and no safetensors."""
    import shutil

    import torch
    from safetensors.torch import load_file

    shutil.copytree(model_dir, target)
    for weights in target.glob("*.safetensors"):
        torch.save(load_file(weights), target / "pytorch_model.bin")
        weights.unlink()
    return target


def test_a_local_model_without_safetensors_weights_is_refused_at_handoff(
    cli, write_config, tiny_model_dir, prompts, workdir
) -> None:
    """verl's LoRA rollout loads vLLM's base from safetensors: a directory whose weights became
    pytorch_model.bin after the plan (the plan refuses pickle weights itself) is refused in one line, and no
    bundle is left behind."""
    import shutil

    shutil.copytree(tiny_model_dir, workdir / "model")
    _plan(cli, write_config, tiny_config(workdir / "model"))
    _bin_only_copy(workdir / "model", workdir / "bin-model")
    shutil.rmtree(workdir / "model")
    (workdir / "bin-model").rename(workdir / "model")
    result = cli("handoff", "plan.json", "--out", "bundle")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "no *.safetensors weights" in result.err and "Traceback" not in result.err
    assert not (workdir / "bundle").exists()


def test_launch_sh_stops_before_verl_on_a_model_without_safetensors_weights(
    cli, write_config, tiny_model_dir, prompts, workdir
) -> None:
    """A bundle's model/ without safetensors (emptied, then pickle weights only): launch.sh exits 2 in one line and
    verl never starts; with the safetensors back it starts. (A model path that is not a directory, as diagnose's
    dry launch passes, is left to verl: test_handoff_verl's ready bundles.)"""
    import subprocess

    _plan(cli, write_config, tiny_config(tiny_model_dir))
    assert cli("handoff", "plan.json", "--out", "bundle").code == 0
    fake = workdir / "bin"
    fake.mkdir()
    (fake / "python").write_text("#!/bin/sh\necho verl-started\n")
    (fake / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    bundle = workdir / "bundle"
    for weights in (bundle / "model").glob("*.safetensors"):
        weights.unlink()
    done = subprocess.run(["bash", "launch.sh"], cwd=bundle, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "verl-started" not in done.stdout
    assert done.stderr.count("\n") == 1 and "has no *.safetensors weights" in done.stderr
    _bin_only_copy(tiny_model_dir, workdir / "restored")
    (bundle / "model").rename(workdir / "emptied")
    (workdir / "restored").rename(bundle / "model")
    done = subprocess.run(["bash", "launch.sh"], cwd=bundle, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "has no *.safetensors weights" in done.stderr
    for weights in tiny_model_dir.glob("*.safetensors"):
        (bundle / "model" / weights.name).write_bytes(weights.read_bytes())
    done = subprocess.run(["bash", "launch.sh"], cwd=bundle, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "verl-started" in done.stdout


def test_reward_fn_scores_the_reward_model_as_a_miniverl_run(tiny_model_dir: Path, monkeypatch) -> None:
    """reward_fn.py's reward-model term is miniverl's RewardModel on the same text, bit for bit (CPU, one text)."""
    from transformers import AutoTokenizer

    from miniverl.config.schema import RewardModelSpec
    from miniverl.handoff.reward_bridge import TOKENIZER_ENV, load_reward_model, score
    from miniverl.rewards.reward_model import RewardModel, reward_model_identity

    spec = RewardModelSpec(source="tiny", tiny={"seed": 2}, template="Q: {prompt}\nA: {response}")
    identity = reward_model_identity(spec)[0]
    monkeypatch.setenv(TOKENIZER_ENV, str(tiny_model_dir))
    load_reward_model.cache_clear()
    bundle_rm = {"spec": spec.model_dump(mode="json", exclude={"placement", "batch_size", "path"}),
                 "identity": identity, "weight": 0.5}  # fmt: skip
    extra = {"prompt": "What is 2+3?", "prompt_id": "p0", "context": "", "task": "calculator"}
    got = score([], False, "miniverl/calculator", "It is 5.", "5", extra, bundle_rm)
    run_rm = RewardModel(spec, device="cpu", student_tokenizer=AutoTokenizer.from_pretrained(str(tiny_model_dir)))
    expected = 0.5 * run_rm.scores(["Q: What is 2+3?\nA: It is 5."])[0]
    assert got == expected and got != 0.0
    with pytest.raises(Exception, match="changed since"):  # the plan's pin is checked at launch
        load_reward_model.cache_clear()
        score([], False, "miniverl/calculator", "x", "5", extra, {**bundle_rm, "identity": {"source": "tiny"}})


def _native_tiny(workdir: Path) -> Path:
    """The example native verl YAML, shrunk for the tiny model (written once; never edited afterwards)."""
    native = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "verl-native-grpo.yaml").read_text())
    native["data"]["max_response_length"] = 6
    native["actor_rollout_ref"]["rollout"]["n"] = 2
    native["actor_rollout_ref"]["actor"]["optim"]["lr"] = 0.01
    native["reward"]["custom_reward_function"]["reward_kwargs"]["miniverl_rewards"] = [
        {"name": "target_length", "weight": 1.0, "params": {"target_tokens": 3}}
    ]
    path = workdir / "native.yaml"
    path.write_text(yaml.safe_dump(native, sort_keys=False))
    return path


def test_direct_config_plan_run_inspect_resume_handoff(cli, tiny_model_dir, prompts, workdir: Path) -> None:
    """Native GRPO YAML -> plan (v4) -> run 2 cycles -> inspect -> resume (no-op) -> handoff; bytes unchanged."""
    native = _native_tiny(workdir)
    digest = sha256_file(native)
    planned = cli(
        "plan", "--verl-config", str(native), "--set", f"model={tiny_model_dir}", "--set", "device=cpu",
        "--set", "trajectory_batch_size=2", "--set", "batch_size=4", "--out", "plan.json", "--json",
    )  # fmt: skip
    assert planned.code == 0, planned.err
    assert planned.json()["compiler"] == "verl-rl-v0.9-single-gpu-v4" and planned.json()["native_sha256"] == digest
    section = planned.json()["handoff"]
    assert (section["status"], section["compiler"]) == ("compiles", "verl-rl-v0.9-single-gpu-v1")
    assert section["imported_by"] == "verl-rl-v0.9-single-gpu-v4"
    plan = json.loads(Path("plan.json").read_text())
    direct = plan["direct_config"]
    assert direct["native"]["text"].encode() == native.read_bytes()
    assert direct["runtime_bindings"] == {
        "model": os.path.relpath(tiny_model_dir), "device": "cpu", "trajectory_batch_size": 2, "batch_size": 4,
    }  # fmt: skip
    _no_local_paths(Path("plan.json"), workdir, tiny_model_dir)  # given as an absolute directory, recorded relative
    assert set(direct) >= {"rules_digest", "import_digest", "compiler"}
    refused = cli(
        "plan", "--verl-config", str(native), "--set", "model=x", "--set", "train.cycles=5", "--out", "p2.json"
    )
    assert refused.code == 2 and "not_a_runtime_binding" in refused.err
    both = cli("plan", "config.yaml", "--verl-config", str(native), "--set", "model=x", "--out", "p3.json")
    assert both.code == 2 and "not both" in both.err
    human = cli("plan", "--verl-config", str(native), "--set", f"model={tiny_model_dir}", "--out", "p4.json")
    assert human.code == 0 and f"verl-rl-v0.9-single-gpu-v4, native sha256 {digest}" in human.out

    ran = cli("run", "--plan", "plan.json", "--run-id", "d", "--json")
    assert ran.code == 0, ran.err
    assert json.loads((workdir / "runs" / "d" / "plan.json").read_text())["direct_config"] == direct
    report = cli("inspect", "runs/d", "--json").json()
    assert report["updates"] == 2 and report["status"] == "completed"
    assert report["direct_config"]["compiler"] == "verl-rl-v0.9-single-gpu-v4"
    assert report["direct_config"]["native_sha256"] == digest and report["direct_config"]["native_sha256_verified"]
    human = cli("inspect", "runs/d")
    assert f"verl-rl-v0.9-single-gpu-v4 (native native.yaml sha256 {digest}, verified)" in human.out
    resumed = cli("run", "--plan", "plan.json", "--run-id", "d", "--resume", "--json")
    assert resumed.code == 0, resumed.err
    assert cli("inspect", "runs/d", "--json").json()["updates"] == 2
    extended = cli("run", "--plan", "plan.json", "--run-id", "d", "--resume", "--extend", "1", "--json")
    assert extended.code == 0, extended.err
    report = cli("inspect", "runs/d", "--json").json()
    assert report["updates"] == 3 and report["direct_config"]["native_sha256_verified"]
    assert sha256_file(native) == digest

    handed = cli("handoff", "runs/d", "--out", "bundle", "--json")
    assert handed.code == 0, handed.err
    bundle = workdir / "bundle"
    manifest = json.loads((bundle / "manifest.json").read_text())
    evidence = manifest["direct_config"]
    assert evidence["compiler"] == "verl-rl-v0.9-single-gpu-v4" and evidence["native_sha256"] == digest
    assert evidence["rules_digest"] == direct["rules_digest"] and evidence["semantically_equal"]
    assert evidence["runtime_bindings"]["model"].startswith("model/")  # no local path in the bundle
    assert manifest["compiler"] == "verl-rl-v0.9-single-gpu-v1"  # the export of the imported GRPO plan
    assert sha256_file(bundle / "native" / "native.yaml") == digest
    assert manifest["files"]["native-diff.json"]["sha256"] == sha256_file(bundle / "native-diff.json")
    diff = json.loads((bundle / "native-diff.json").read_text())
    differing = {e["key"] for e in diff["entries"] if e["status"] != "same"}
    assert differing == {
        "actor_rollout_ref.model.path",  # the binding (a local model: the bundle's model/)
        "actor_rollout_ref.model.lora_adapter_path",  # the run's adapter the bundle starts from
        "actor_rollout_ref.model.use_liger",  # default: the bundle states verl's own False
        "actor_rollout_ref.actor.strategy",  # the native file's FSDP1, the bundle's FSDP2: an engine choice
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",  # trajectory_batch_size
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.gpu_memory_utilization",  # vLLM only
        "actor_rollout_ref.rollout.load_format",  # safetensors: verl's LoRA sync needs the base from the checkpoint
        "actor_rollout_ref.rollout.layered_summon",  # the adapter gathered layer by layer (verl's LoRA example)
        "data.train_files",  # rewritten in verl's columns as data/train.parquet
        "data.val_files",
        "reward.custom_reward_function.reward_kwargs.miniverl_rewards",  # carried inside reward_fn.py
        "trainer.project_name",  # ignored: logging
        "trainer.total_epochs",  # ignored: total_training_steps decides
        "trainer.total_training_steps",  # 2 + the 1 cycle of the recorded extension
    }
    statuses = {e["key"]: e["status"] for e in diff["entries"]}
    assert statuses.pop("trainer.total_training_steps") == "extended" and diff["added_cycles"] == 1
    assert statuses.pop("actor_rollout_ref.model.use_liger") == "default"
    others = differing - {"trainer.total_training_steps", "actor_rollout_ref.model.use_liger"}
    assert {statuses[k] for k in others} == {"runtime", "ignored"}
    assert sha256_file(native) == digest  # the native file was never edited
    _no_local_paths(bundle, workdir, tiny_model_dir)
    _no_local_paths(workdir / "runs" / "d" / "plan.json", workdir, tiny_model_dir)
