"""``miniverl diagnose`` against the real verl 0.9.1 (run by ``nox -s verl``; skipped where verl is absent)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

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
