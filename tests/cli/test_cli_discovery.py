"""Discovery: `init` from packaged examples, `rewards list`, `models list`, and help for every option."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.cli.test_cli_errors import assert_clean_error
from tests.conftest import CliResult


@pytest.mark.parametrize(
    ("example", "algorithm", "rows", "heldout"),
    [("grpo", "grpo", 512, 64), ("grpo-gpu", "grpo", 512, 64), ("opd", "opd", 32, None), ("ppo", "ppo", 32, None)],
)
def test_init_writes_a_config_that_plans(
    cli: Callable[..., CliResult], workdir: Path, example: str, algorithm: str, rows: int, heldout: int | None
) -> None:
    result = cli("init", "proj", "--example", example, "--json")
    assert result.code == 0, result.err
    written = ["config.yaml", *(["heldout.parquet"] if heldout else []), "prompts.parquet"]
    assert sorted(p.name for p in (workdir / "proj").iterdir()) == written
    config = yaml.safe_load((workdir / "proj" / "config.yaml").read_text())
    assert config["algorithm"]["name"] == algorithm
    import os

    os.chdir(workdir / "proj")
    planned = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert planned.code == 0, planned.err
    assert planned.json()["models"]["student"]["name"] == "smollm2-135m-instruct"
    dry = cli("run", "--plan", "plan.json", "--run-id", "first", "--dry-run", "--json")
    assert dry.code == 0 and dry.json()["rows"] == result.json()["rows"] == rows
    assert result.json().get("heldout_rows") == heldout


def test_the_grpo_examples_hold_out_prompts_they_never_train_on(cli: Callable[..., CliResult], workdir: Path) -> None:
    import pyarrow.parquet as pq

    human = cli("init", "proj", "--example", "grpo")
    assert human.code == 0 and "miniverl eval runs/first --data heldout.parquet" in human.out
    train = pq.read_table(workdir / "proj" / "prompts.parquet").to_pylist()
    heldout = pq.read_table(workdir / "proj" / "heldout.parquet").to_pylist()
    assert len(heldout) == 64 and not {r["prompt"] for r in heldout} & {r["prompt"] for r in train}
    assert {r["task"] for r in train + heldout} == {"calculator"}
    assert cli("init", "gpu", "--example", "grpo-gpu", "--quiet").code == 0
    assert pq.read_table(workdir / "gpu" / "heldout.parquet").to_pylist() == heldout


def test_init_refuses_to_overwrite(cli: Callable[..., CliResult], workdir: Path) -> None:
    assert cli("init", ".", "--quiet").code == 0
    assert_clean_error(cli("init", "."), 2, "already has config.yaml, prompts.parquet")
    assert cli("init", ".", "--force", "--quiet").code == 0
    assert_clean_error(cli("init", ".", "--example", "dpo"), 2, "invalid choice: 'dpo'")


def test_rewards_list(cli: Callable[..., CliResult]) -> None:
    rewards = {r["name"]: r for r in cli("rewards", "list", "--json").json()["rewards"]}
    assert {"calculator_exact", "target_length"} <= set(rewards)
    assert [p["name"] for p in rewards["target_length"]["params"]] == ["target_tokens", "tolerance", "terminator_bonus"]
    human = cli("rewards", "list").out
    assert "target_tokens=24" in human and "package.module:function" in human


def test_models_list(cli: Callable[..., CliResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path / "empty-cache"))
    models = cli("models", "list", "--json").json()["models"]
    assert models[0]["name"] == "smollm2-135m-instruct" and models[0]["cached"] is False
    assert "miniverl models fetch smollm2-135m-instruct" in cli("models", "list").out


def _parsers(parser: argparse.ArgumentParser, prefix: str = "miniverl") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(prefix, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _parsers(child, f"{prefix} {name}")
    return found


def test_every_option_has_help() -> None:
    from miniverl.cli import build_parser

    missing = [
        f"{where}: {'/'.join(action.option_strings) or action.dest}"
        for where, parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction | argparse._HelpAction) and not action.help
    ]
    assert missing == []


def test_help_exits_zero(cli: Callable[..., CliResult]) -> None:
    result = cli("run", "--help")
    assert result.code == 0 and "--resume" in result.out and "--threads" in result.out


def test_wheel_ships_the_examples(tmp_path: Path) -> None:
    """`init` works from the built wheel: hatchling packs the example files (needs `build`)."""
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("build")
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(repo)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 and "hatchling" in proc.stderr + proc.stdout:
        pytest.skip("the isolated build cannot get hatchling here")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("miniverl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for example in ("grpo", "opd", "ppo"):
        assert {f"miniverl/examples/{example}/config.yaml", f"miniverl/examples/{example}/prompts.jsonl"} <= names
