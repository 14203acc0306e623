"""The bundle's executable files for each model binding: launch.sh parses, reward_fn.py compiles."""

from __future__ import annotations

import ast
import json
import subprocess

import pytest

from miniverl.handoff.launch import launch_script, reward_file
from tests.unit.test_handoff_compiler import HUB_REVISION, _compile


@pytest.mark.parametrize("binding", ["hub", "builtin"])
def test_launch_script_resolves_the_model_and_parses(binding: str, tmp_path) -> None:
    if binding == "hub":
        ir = _compile()
    else:
        ir = _compile(models__student={"source": "builtin", "model_id": "smollm2-135m-instruct", "lora": {"r": 8}})
    text = launch_script(ir, "miniverl_grpo")
    (tmp_path / "launch.sh").write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "launch.sh")], check=True)
    assert "python -m verl.trainer.main_ppo" in text and "MINIVERL_MODEL_PATH" in text
    if binding == "hub":
        assert f'snapshot_download("Qwen/Qwen3-0.6B", revision="{HUB_REVISION}")' in text
    else:
        assert "python -m miniverl models fetch smollm2-135m-instruct --json" in text
    assert "lora_adapter_path" not in text


def test_reward_file_compiles_and_carries_the_terms() -> None:
    ir = _compile()
    text = reward_file(ir)
    tree = ast.parse(text)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "compute_score" for n in tree.body)
    namespace: dict = {}
    exec(compile(text, "reward_fn.py", "exec"), namespace)
    assert namespace["TERMS"] == [t.model_dump(mode="json") for t in ir.reward.terms]
    assert namespace["NEEDS_RESPONSE_TOKEN_COUNT"] is True
    assert json.loads(json.dumps(namespace["TERMS"]))[1]["params"] == {"target_tokens": 16}
