"""``miniverl diagnose`` against the real verl 0.9.1 (run by ``nox -s verl``; skipped where verl is absent)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import CliResult, tiny_config

pytest.importorskip("verl", reason="verl 0.9.1 lives in its own venv: nox -s verl")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NO_VLLM = importlib.util.find_spec("vllm") is None


def _bundle(cli: Callable[..., CliResult], config: Path, out: str, *overrides: str) -> Path:
    args = ["plan", str(config), "--out", "plan.json"]
    for item in overrides:
        args += ["--set", item]
    planned = cli(*args)
    assert planned.code == 0, planned.err
    result = cli("handoff", "plan.json", "--out", out, "--json")
    assert result.code == 0, result.err
    return Path(out)


def _diagnose(cli: Callable[..., CliResult], bundle: Path) -> tuple[int, dict]:
    result = cli("diagnose", str(bundle), "--json")
    assert result.err == "", result.err
    return result.code, result.json()


def test_grpo_example_bundle_is_ready(cli, prompts, workdir: Path) -> None:
    bundle = _bundle(cli, EXAMPLES / "grpo-smollm2.yaml", "bundle")
    code, report = _diagnose(cli, bundle)
    assert report["launch_status"] == "ready", report["blockers"]
    assert code == 0 and report["ray_started"] is False
    checks = report["checks"]
    assert checks["verl_version"] == "0.9.1"
    assert checks["validate_config"]["passed"] and checks["validate_config"]["adv_estimator"] == "grpo"
    assert checks["validate_config"]["use_critic"] is False
    assert checks["overlay"]["applied"] is True
    assert checks["reward"]["terms"] == ["calculator_exact", "target_length"]
    assert checks["model"]["binding"] == "builtin"
    assert checks["launch_script"]["composed"] is True  # launch.sh --cfg job through verl's main_ppo
    if NO_VLLM:
        assert checks["stand_ins"] == ["verl.workers.rollout.vllm_rollout", "verl.workers.rollout.vllm_rollout.utils"]


# verl 0.9.1's own adapter gather for its vLLM weight sync (``collect_lora_params``) on a one-process gloo group: the
# world size of one GPU, where FSDP1 runs NO_SHARD. Printed per case (strategy, layered_summon): the LoRA tensors
# vLLM would get, or the error.
LORA_GATHER = """
import json, sys
import torch, torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.device_mesh import init_device_mesh
from transformers import LlamaConfig, LlamaForCausalLM
from verl.utils.fsdp_utils import apply_fsdp2, collect_lora_params, get_fsdp_wrap_policy

rank, alpha, targets, cases = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), json.loads(sys.argv[4])
dist.init_process_group("gloo", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, tie_word_embeddings=True)
gathered = {}
for strategy, layered in cases:
    lora = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    model = get_peft_model(LlamaForCausalLM(config), lora)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy
        apply_fsdp2(model, {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(), "reshard_after_forward": True}, {})
        module = model
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        policy = get_fsdp_wrap_policy(model, config={"min_num_params": 0}, is_lora=True)
        module = FullyShardedDataParallel(model, auto_wrap_policy=policy, device_id=torch.device("cpu"),
                                          device_mesh=mesh, sharding_strategy=ShardingStrategy.NO_SHARD,
                                          use_orig_params=False)
    try:
        result = {"tensors": sorted(collect_lora_params(module, layered_summon=layered, base_sync_done=True))}
    except Exception as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    gathered[f"{strategy} {layered}"] = result
print(json.dumps(gathered))
dist.destroy_process_group()
"""


def _lora_gather(rank: int, alpha: int, targets: list[str], cases: list[tuple[str, bool]]) -> dict[str, dict]:
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-c", LORA_GATHER, str(rank), str(alpha), ",".join(targets), json.dumps(cases)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_verl_gathers_the_bundles_lora_adapter_for_vllm(cli, write_config, tiny_model_dir, prompts, workdir) -> None:
    """The bundle's actor strategy and layered_summon, through verl 0.9.1's own adapter gather at world size 1 (one
    GPU): every LoRA tensor reaches vLLM's add_lora. verl's FSDP1 there gathers nothing without layered_summon
    (vLLM's add_lora then gets an empty adapter: the H100's second attempt) and fails with it (the third)."""
    bundle = _bundle(cli, write_config(tiny_config(tiny_model_dir)), "bundle")
    verl = yaml.safe_load((bundle / "config" / "miniverl_grpo.yaml").read_text())["actor_rollout_ref"]
    model, strategy, layered = verl["model"], verl["actor"]["strategy"], verl["rollout"]["layered_summon"]
    targets = [t for t in model["target_modules"] if t.endswith("_proj")]
    every = {
        f"base_model.model.model.layers.{layer}.{block}.{target}.lora_{side}.weight"
        for layer in (0, 1)
        for target in targets
        for block in (["self_attn"] if target[0] in "qkvo" else ["mlp"])
        for side in "AB"
    }
    cases = [(strategy, layered), ("fsdp", False), ("fsdp", True)]
    gathered = _lora_gather(model["lora_rank"], model["lora_alpha"], targets, cases)
    assert set(gathered[f"{strategy} {layered}"].get("tensors", [])) == every, gathered
    assert gathered["fsdp False"] == {"tensors": []}
    assert "NO_SHARD" in gathered["fsdp True"].get("error", ""), gathered


def test_local_model_bundle_loads_with_verls_dataset(cli, write_config, tiny_model_dir, prompts, workdir) -> None:
    config = write_config(tiny_config(tiny_model_dir))
    bundle = _bundle(cli, config, "bundle")
    code, report = _diagnose(cli, bundle)
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    dataset = report["checks"]["verl_dataset"]
    assert dataset["rows"] == 8 and {"prompt", "reward_model", "extra_info"} <= set(dataset["first_keys"])
    assert 0.0 <= dataset["reward_probe"] <= 1.0


def test_verl_validation_failure_is_a_named_blocker(cli, write_config, tiny_model_dir, prompts, workdir) -> None:
    bundle = _bundle(cli, write_config(tiny_config(tiny_model_dir)), "bundle")
    yaml_path = bundle / "config" / "miniverl_grpo.yaml"
    text = yaml_path.read_text()
    yaml_path.write_text(text.replace("ppo_mini_batch_size: 2", "ppo_mini_batch_size: 5"))
    code, report = _diagnose(cli, bundle)
    codes = [b["code"] for b in report["blockers"]]
    assert code == 1 and report["launch_status"] == "bundle_modified"
    assert "verl_validation_failed" in codes, codes


def test_rules_and_ir_digests_reach_the_report(cli, prompts, workdir: Path) -> None:
    bundle = _bundle(cli, EXAMPLES / "grpo-smollm2.yaml", "bundle", "train.cycles=2")
    manifest = json.loads((bundle / "manifest.json").read_text())
    _, report = _diagnose(cli, bundle)
    assert (report["ir_digest"], report["rules_digest"]) == (manifest["ir_digest"], manifest["rules_digest"])
    # the keys the qualification harness reads
    assert (report["launch_status"], report["compiler"], report["verl_version"]) == (
        "ready", manifest["compiler"], "0.9.1",
    )  # fmt: skip


def test_run_bundle_with_adapter_is_ready(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir)
    config["train"]["cycles"] = 1
    planned = cli("plan", str(write_config(config)), "--out", "plan.json")
    assert planned.code == 0, planned.err
    assert cli("run", "--plan", "plan.json", "--run-id", "r").code == 0
    assert cli("handoff", "runs/r", "--out", "bundle").code == 0
    code, report = _diagnose(cli, workdir / "bundle")
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    assert report["checks"]["adapter"]["r"] == 4 and report["checks"]["overlay"]["applied"]


def test_nf4_plan_bundle_is_ready_on_the_full_precision_base(cli, write_config, tiny_model_dir, prompts, workdir):
    config = tiny_config(tiny_model_dir)
    config["models"]["student"]["quantization"] = "nf4"
    bundle = _bundle(cli, write_config(config), "bundle")  # a plan: no NF4 weights loaded here
    code, report = _diagnose(cli, bundle)
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    assert report["quantization"] == {"trained": "nf4", "handed_off": "none", "carried_over": False}
    human = cli("diagnose", str(bundle))
    assert "note: trained on NF4 base weights; verl loads the float32 base (quantization not carried over)" in human.out


@pytest.mark.parametrize(("mode", "estimator"), [("loss", "low_var_kl"), ("reward", "k1")])
def test_grpo_kl_bundle_is_ready_with_verls_reference(
    cli, write_config, tiny_model_dir, prompts, workdir, mode, estimator
):
    config = tiny_config(tiny_model_dir)
    config["models"]["reference"] = {"source": "student"}
    config["algorithm"]["grpo"] = {"kl_coef": 0.05, "kl_estimator": estimator, "kl_mode": mode}
    bundle = _bundle(cli, write_config(config), "bundle")
    code, report = _diagnose(cli, bundle)
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    checks = report["checks"]
    assert checks["validate_config"]["use_reference_policy"] is True and checks["overlay"]["applied"]


def test_ppo_example_bundle_is_ready(cli, prompts, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiler v2 on examples/ppo-verl-smollm2.yaml: critic (from critic_adapter/), rule rewards, reward model."""
    import os

    from miniverl.models.builtin import cached_builtin

    cache = os.environ.get("MINIVERL_CACHE")
    if cache and not Path(cache).is_absolute():  # nox gives it relative to the repository; the test runs elsewhere
        monkeypatch.setenv("MINIVERL_CACHE", str(EXAMPLES.parent / cache))

    if cached_builtin("smollm2-135m-instruct") is None:  # verl's critic config reads the base's config.json
        pytest.skip("SmolLM2 is not in MINIVERL_CACHE (`make test` fetches it; this venv's transformers cannot)")
    bundle = _bundle(cli, EXAMPLES / "ppo-verl-smollm2.yaml", "bundle")
    code, report = _diagnose(cli, bundle)
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    assert (report["compiler"], report["verl_version"]) == ("verl-rl-v0.9-single-gpu-v2", "0.9.1")
    checks = report["checks"]
    assert checks["validate_config"]["use_critic"] is True and checks["validate_config"]["adv_estimator"] == "gae"
    assert checks["critic_adapter"]["task_type"] == "TOKEN_CLS" and checks["critic_adapter"]["value_head"] == "score"
    assert checks["reward"]["terms"] == ["calculator_exact", "target_length", "reward_model"]
    assert checks["reward"]["reward_model"] == "tiny" and checks["overlay"]["applied"]


def test_ppo_run_bundle_is_ready_and_verl_trains_its_critic_head(
    cli, write_config, tiny_model_dir, prompts, workdir: Path
) -> None:
    """A tiny PPO run hands off actor and critic; verl's own _build_lora_module on critic_adapter/ leaves the
    LoRA and the value head (score) trainable, with miniverl's head values."""
    import types

    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForTokenClassification
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from miniverl.handoff.critic_adapter import SCORE_KEYS
    from tests.integration.test_handoff_ppo import example_on_tiny

    write_config(example_on_tiny(tiny_model_dir))
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    assert cli("run", "--plan", "plan.json", "--run-id", "p").code == 0
    assert cli("handoff", "runs/p", "--out", "bundle").code == 0
    code, report = _diagnose(cli, workdir / "bundle")
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    assert report["checks"]["critic_adapter"]["lora_tensors"] > 0 and report["checks"]["adapter"]["r"] == 8

    config = AutoConfig.from_pretrained(str(tiny_model_dir))
    config.num_labels, config.classifier_dropout = 1, 0.0  # as verl's critic
    module = AutoModelForTokenClassification.from_pretrained(str(tiny_model_dir), config=config)
    engine = types.SimpleNamespace(
        model_config=types.SimpleNamespace(lora_adapter_path=str(workdir / "bundle" / "critic_adapter"), use_shm=False)
    )
    wrapped = FSDPEngine._build_lora_module(engine, module)  # verl's own wrap of a LoRA critic
    trainable = {n: p for n, p in wrapped.named_parameters() if p.requires_grad}
    head = [p for n, p in trainable.items() if "score" in n and n.endswith("weight")]
    assert head and any("lora_A" in n for n in trainable), sorted(trainable)
    saved = load_file(str(workdir / "bundle" / "critic_adapter" / "adapter_model.safetensors"))
    assert torch.equal(head[0].detach(), saved[SCORE_KEYS[0]])


def test_verls_fresh_lora_critic_still_leaves_the_value_head_untrained() -> None:
    """Why the bundle carries critic_adapter/: verl's fresh LoRA critic wrap (CAUSAL_LM LoraConfig, no
    modules_to_save) does not train the value head. If verl or peft change this, revisit the v2 rules."""
    import inspect

    import torch
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import LlamaConfig, LlamaForTokenClassification
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    source = inspect.getsource(FSDPEngine._build_lora_module)
    assert "TaskType.CAUSAL_LM" in source and "modules_to_save" not in source
    assert "PeftModel.from_pretrained" in source and "lora_adapter_path" in source
    torch.manual_seed(0)
    tiny = LlamaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=32, num_labels=1)  # fmt: skip
    lora = LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    try:
        wrapped = get_peft_model(LlamaForTokenClassification(tiny), lora)
    except AttributeError:
        return  # peft 0.21: the wrap fails outright (no prepare_inputs_for_generation)
    score = [p.requires_grad for n, p in wrapped.named_parameters() if "score" in n]
    assert score and not any(score), "verl's fresh LoRA critic now trains its value head: revisit the v2 rules"


def test_grpo_reward_model_bundle_scores_with_miniverls_reward_model(
    cli, write_config, tiny_model_dir, prompts, workdir
):
    config = tiny_config(tiny_model_dir)
    config["models"]["reward"] = {"source": "tiny", "tiny": {"seed": 1}}
    config["algorithm"]["rewards"] = [*config["algorithm"]["rewards"], {"name": "reward_model", "weight": 0.5}]
    bundle = _bundle(cli, write_config(config), "bundle")
    code, report = _diagnose(cli, bundle)
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    checks = report["checks"]
    assert checks["reward"]["reward_model"] == "tiny" and checks["reward"]["terms"][-1] == "reward_model"
    rule_only = _bundle(cli, write_config(tiny_config(tiny_model_dir)), "rule-only")
    _, plain = _diagnose(cli, rule_only)
    # the same rule terms plus 0.5 x the tiny classifier's logit: a different, finite reward
    assert checks["verl_dataset"]["reward_probe"] != plain["checks"]["verl_dataset"]["reward_probe"]


def test_direct_config_bundle_is_ready(cli, prompts, workdir: Path) -> None:
    """Compiler v4: the example native verl YAML, imported with runtime bindings, hands off to a `ready` bundle."""
    native = EXAMPLES / "verl-native-grpo.yaml"
    planned = cli(
        "plan", "--verl-config", str(native), "--set", "model=smollm2-135m-instruct", "--set", "device=cpu",
        "--out", "plan.json", "--json",
    )  # fmt: skip
    assert planned.code == 0, planned.err
    assert planned.json()["compiler"] == "verl-rl-v0.9-single-gpu-v4"
    result = cli("handoff", "plan.json", "--out", "bundle", "--json")
    assert result.code == 0, result.err
    assert result.json()["direct_config"]["semantically_equal"] is True
    code, report = _diagnose(cli, Path("bundle"))
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    assert report["checks"]["validate_config"]["adv_estimator"] == "grpo"
    assert report["checks"]["reward"]["terms"] == ["calculator_exact", "target_length"]


@pytest.mark.parametrize(
    ("example", "estimator"), [("verl-native-ppo.yaml", "gae"), ("verl-native-grpo-2x2.yaml", "grpo")]
)
def test_native_multi_pass_bundles_are_ready(cli, tiny_model_dir, prompts, workdir: Path, example, estimator) -> None:
    """Compiler v4 on the native PPO file (GAE, LoRA critic, 2 epochs x 2 mini-batches; the critic 1 x 2) and the
    native GRPO 2 x 2 file, unedited, on a local model: the bundles round-trip and verl 0.9.1 validates them."""
    native = EXAMPLES / example
    planned = cli(
        "plan", "--verl-config", str(native), "--set", f"model={tiny_model_dir}", "--set", "device=cpu",
        "--out", "plan.json", "--json",
    )  # fmt: skip
    assert planned.code == 0, planned.err
    result = cli("handoff", "plan.json", "--out", "bundle", "--json")
    assert result.code == 0, result.err
    assert result.json()["direct_config"]["semantically_equal"] is True
    code, report = _diagnose(cli, Path("bundle"))
    assert code == 0 and report["launch_status"] == "ready", report["blockers"]
    checks = report["checks"]
    assert checks["validate_config"]["adv_estimator"] == estimator and checks["overlay"]["applied"]
    assert checks["validate_config"]["use_critic"] is (estimator == "gae")
    if estimator == "gae":
        assert report["compiler"] == "verl-rl-v0.9-single-gpu-v2"
        assert (
            checks["critic_adapter"]["task_type"] == "TOKEN_CLS" and checks["critic_adapter"]["value_head"] == "score"
        )
