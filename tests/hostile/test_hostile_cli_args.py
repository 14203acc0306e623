"""Class: CLI arguments. Every argument is validated at parse time, before any file is read or model loaded:
one line, exit 2. An option that does not apply is refused, never silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_cli_errors import assert_clean_error


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--temperature", "inf"], "inf is not a temperature"),
        (["--temperature", "nan"], "nan is not a temperature"),
        (["--temperature", "-1"], "-1 is not a temperature"),
        (["--temperature", "0"], "0 is not a temperature"),
        (["--max-new-tokens", "0"], "0 must be at least 1"),
        (["--seed", str(10**30)], "exceeds the limit of 9,223,372,036,854,775,807"),
        (["--seed", "-1"], "-1 must be at least 0"),
    ],
)
def test_eval_arguments_are_refused_before_anything_loads(cli, workdir: Path, args: list[str], needle: str) -> None:
    # neither the run nor the data exist: the refusal comes first, from the arguments alone
    assert_clean_error(cli("eval", "no-run", "--data", "none.parquet", *args), 2, needle)


def test_bindings_without_verl_config_is_refused(cli, workdir: Path) -> None:
    (workdir / "b.yaml").write_text("model: x\n")
    assert_clean_error(cli("plan", "c.yaml", "--bindings", "b.yaml"), 2, "--bindings applies to --verl-config only")
    assert not (workdir / "plan.json").exists()


def test_a_seed_torch_cannot_take_is_refused_at_plan(cli, write_config, tiny_model_dir: Path, prompts: Path) -> None:
    from tests.conftest import tiny_config

    write_config(tiny_config(tiny_model_dir))
    result = cli("plan", "config.yaml", "--set", f"run.seed={10**30}", "--out", "plan.json")
    assert_clean_error(result, 2, "run.seed")
