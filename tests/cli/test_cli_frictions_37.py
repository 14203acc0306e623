"""The small frictions of issue 37, each pinned: "did you mean" (TRL and verl names too), a quote hint for JSON
numbers, and what ``diagnose`` says about launching apart from the config it validated."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_config


@pytest.mark.parametrize(
    ("override", "hint"),
    [
        ("train.lr=1e-4", "did you mean train.learning_rate (the learning rate)?"),
        ("train.learning_rat=1e-4", "did you mean train.learning_rate?"),
        ("rollout.num_generations=4", "did you mean rollout.samples_per_prompt (TRL's num_generations)?"),
        ("num_generations=4", "did you mean rollout.samples_per_prompt (TRL's num_generations)?"),
        ("rollout.n=4", "did you mean rollout.samples_per_prompt (verl's actor_rollout_ref.rollout.n)?"),
        ("algorithm.grpo.beta=0.1", "did you mean algorithm.grpo.kl_coef (TRL's beta, the KL coefficient)?"),
        ("cycles=3", "did you mean train.cycles?"),
    ],
)
def test_unknown_keys_get_a_did_you_mean(cli, tiny_model_dir: Path, prompts: Path, workdir: Path, override: str,
                                         hint: str) -> None:  # fmt: skip
    (workdir / "config.yaml").write_text(yaml.safe_dump(tiny_config(tiny_model_dir)))
    result = cli("plan", "config.yaml", "--out", "plan.json", "--set", override)
    key = override.partition("=")[0]
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert result.err.strip().endswith(f"unknown key {key!r}; {hint}"), result.err
    assert not (workdir / "plan.json").exists()


def test_an_unknown_key_with_nothing_close_gets_no_guess() -> None:
    from miniverl.config.schema import MiniverlConfig
    from miniverl.config.suggest import PEER_NAMES, dotted_keys, suggestion

    assert suggestion(MiniverlConfig, ("zzz",)) is None and suggestion(MiniverlConfig, ("train", "zzzz")) is None
    keys = set(dotted_keys(MiniverlConfig))
    assert {target for target, _ in PEER_NAMES.values()} <= keys  # every peer name maps to a real key


def test_a_json_number_answer_gets_a_quote_hint(cli, tiny_model_dir: Path, workdir: Path) -> None:
    (workdir / "p.jsonl").write_text('{"prompt": "What is 6 * 7?", "answer": 42}\n')
    config = tiny_config(tiny_model_dir)
    config["data"]["path"] = "p.jsonl"
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert '\'answer\' is int, expected a string: quote it ("answer": "42")' in result.err


def test_diagnose_without_verl_says_where_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from miniverl.handoff import diagnose

    monkeypatch.setattr(diagnose, "in_checkout", lambda: False)
    outside = diagnose.verl_env_hint("0.9.1")
    assert "nox" not in outside and "verl==0.9.1" in outside and "pip install miniverl" not in outside
    monkeypatch.setattr(diagnose, "in_checkout", lambda: True)
    assert "nox -s verl_env" in diagnose.verl_env_hint("0.9.1")


def test_diagnose_names_what_launching_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    import torch

    from miniverl.handoff import diagnose

    real = importlib.util.find_spec
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("vllm", "ray") else real(name))
    missing = diagnose.launch_missing()
    assert missing == [
        "a CUDA GPU (torch.cuda.is_available() is false)",
        "vLLM (verl's rollout engine): not installed",
        "Ray: not installed",
    ]


def test_diagnose_output_keeps_the_config_check_apart_from_launching(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from miniverl.handoff import cli as handoff_cli
    from miniverl.handoff import diagnose

    report = {
        "launch_status": "ready", "blockers": [], "checked": "config valid for verl 0.9.1",
        "launch_missing": [
            "a CUDA GPU (torch.cuda.is_available() is false)", "vLLM (verl's rollout engine): not installed",
        ],
        "checks": {"stand_ins": [], "model": {"dtype": "float32"}},
        "quantization": {"kind": "none"},
    }  # fmt: skip
    monkeypatch.setattr(diagnose, "diagnose", lambda bundle: report)
    monkeypatch.setattr("miniverl.handoff.manifest.quantization_note", lambda *a: "")
    monkeypatch.setattr("miniverl.handoff.ir.QuantizationIR.model_validate", staticmethod(lambda value: value))
    shown: list[str] = []
    code = handoff_cli.run_diagnose(argparse.Namespace(bundle="b"), lambda args, payload, human: shown.append(human))
    assert code == 0
    first, second = shown[0].splitlines()
    assert first.startswith("config valid for verl 0.9.1: composed") and first.endswith("(launch_status: ready)")
    assert second == (
        "  to launch it (launch.sh), this machine lacks: a CUDA GPU (torch.cuda.is_available() is false); "
        "vLLM (verl's rollout engine): not installed. Run launch.sh where they are."
    )
