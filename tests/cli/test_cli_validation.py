"""Validation up front: each bad input exits 2 with one `miniverl: error:` line and no traceback."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.cli.test_cli_errors import assert_clean_error
from tests.conftest import CliResult, tiny_config


def _plan(cli: Callable[..., CliResult], *overrides: str, out: str = "plan.json") -> CliResult:
    args = ["plan", "config.yaml", "--out", out]
    for item in overrides:
        args += ["--set", item]
    return cli(*args)


@pytest.fixture()
def grpo(write_config, tiny_model_dir, prompts) -> dict:
    config = tiny_config(tiny_model_dir)
    write_config(config)
    return config


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.learning_rate=.inf", "train.learning_rate: inf is not a finite number"),
        ("train.adam_betas=[.nan, 0.999]", "train.adam_betas.0: nan is not a finite number"),
        ("algorithm.grpo.clip_high=.inf", "algorithm.grpo.clip_high"),
        ("train.cycles=true", "train.cycles: expected a number, got true"),
        ("rollout.temperature=false", "rollout.temperature: expected a number, got false"),
        ("rollout.samples_per_prompt=1", "GRPO compares samples"),
        ("algorithm.rewards=[{name: calculater_exact}]", "unknown reward 'calculater_exact'"),
        ("algorithm.rewards=[{name: target_length, params: {target: 3}}]", "no parameter(s) ['target']"),
        ("algorithm.rewards=[{name: tests.helpers.nope:fn}]", "cannot import reward module"),
        ("train={cycles: 1, cycles: 2}", "duplicate key 'cycles'"),
        ("train.cycles=" + "9" * 5000, "integer with 5000 digits"),
        ("train.cycles=" + "9" * 50, "train.cycles: 1.000e+50 is out of range"),
    ],
)
def test_plan_refuses(cli, grpo, workdir: Path, override: str, needle: str) -> None:
    assert_clean_error(_plan(cli, override), 2, needle)
    assert not (workdir / "plan.json").exists()


def test_duplicate_yaml_section(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    text = yaml.safe_dump(tiny_config(tiny_model_dir)) + "train:\n  cycles: 5\n"
    (workdir / "config.yaml").write_text(text)
    assert_clean_error(_plan(cli), 2, "duplicate key 'train'")


def test_duplicate_nested_key(cli, write_config, tiny_model_dir, prompts, workdir: Path) -> None:
    config = tiny_config(tiny_model_dir)
    text = yaml.safe_dump(config).replace("  cycles: 2\n", "  cycles: 2\n  cycles: 3\n")
    (workdir / "config.yaml").write_text(text)
    assert_clean_error(_plan(cli), 2, "duplicate key 'cycles'")


@pytest.mark.parametrize(
    ("context", "needle"),
    [
        ({"column": "worked", "template": "{context}\n\n{prompt}"}, "'worked' is not a dataset column"),
        ({"column": "context", "template": "{context} {answer}\n\n{prompt}"}, "unknown placeholder {answer}"),
        ({"column": "context", "template": "{context} {\n\n{prompt}"}, "template"),
        ({"column": "context", "template": "{context}\n\n{prompt}{prompt!r}"}, "no format spec or conversion"),
    ],
)
def test_privileged_context_checked_at_plan(cli, write_config, tiny_model_dir, prompts, context, needle) -> None:
    config = tiny_config(tiny_model_dir, algorithm="opd")
    config["models"]["teacher"]["privileged_context"] = context
    write_config(config)
    assert_clean_error(_plan(cli), 2, needle)


def test_privileged_column_empty_everywhere(cli, write_config, tiny_model_dir, workdir: Path) -> None:
    from miniverl.data import write_prompts

    rows = [{"prompt_id": f"p{i}", "prompt": "1+1?", "answer": "2", "context": "", "task": "t"} for i in range(3)]
    write_prompts(workdir / "prompts.parquet", rows)
    write_config(tiny_config(tiny_model_dir, algorithm="opd"))
    assert_clean_error(_plan(cli), 2, "column 'context' is empty in every row")


def test_non_utf8_parquet(cli, grpo, workdir: Path) -> None:
    from miniverl.data import COLUMNS

    raw = pa.array([b"\xff\xfe broken"], pa.binary())
    bad = pa.Array.from_buffers(pa.string(), 1, raw.buffers())
    table = pa.table({c: (bad if c == "prompt" else pa.array([c])) for c in COLUMNS})
    pq.write_table(table, workdir / "prompts.parquet")
    assert_clean_error(_plan(cli), 2, "not UTF-8")


def test_plan_out_is_a_directory_or_under_a_file(cli, grpo, workdir: Path) -> None:
    (workdir / "adir").mkdir()
    assert_clean_error(_plan(cli, out="adir"), 2, "is a directory")
    (workdir / "afile").write_text("x")
    assert_clean_error(_plan(cli, out="afile/plan.json"), 2, "is a file, not a directory")


@pytest.fixture()
def planned(cli, grpo, workdir: Path) -> Path:
    assert _plan(cli).code == 0
    return workdir / "plan.json"


def _rewrite_plan(path: Path, edit: Callable[[str], str]) -> None:
    path.write_text(edit(path.read_text()))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t.replace('"cycles": 2', '"cycles": ' + "9" * 5000, 1), "5000 digits"),
        (lambda t: t.replace('"cycles": 2', '"cycles": NaN', 1), "non-finite number NaN"),
        (lambda t: t.replace('"cycles": 2', '"cycles": 2, "cycles": 2', 1), "duplicate key 'cycles'"),
        (lambda t: "[1, 2]", "must be a JSON object"),
        (lambda t: t[:-20], "malformed JSON"),
    ],
)
def test_bad_plan_json(cli, planned: Path, workdir: Path, edit, needle: str) -> None:
    _rewrite_plan(planned, edit)
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a", "--dry-run"), 2, needle)
    assert not (workdir / "runs").exists()


def test_non_utf8_plan(cli, planned: Path) -> None:
    planned.write_bytes(b"\xff" + planned.read_bytes())
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a", "--dry-run"), 2, "not UTF-8")


def test_long_run_id(cli, planned: Path, workdir: Path) -> None:
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "r" * 300, "--dry-run"), 2, "300 characters")
    assert not (workdir / "runs").exists()


def test_output_is_a_file(cli, planned: Path, workdir: Path) -> None:
    (workdir / "runs").write_text("not a directory")
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a"), 2, "is a file, not a directory")
    assert_clean_error(cli("run", "--plan", "plan.json", "--output", "runs/x", "--run-id", "a"), 2, "is a file")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_output_not_writable(cli, planned: Path, workdir: Path) -> None:
    locked = workdir / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert_clean_error(cli("run", "--plan", "plan.json", "--output", "locked", "--run-id", "a"), 2, "not writable")
    finally:
        locked.chmod(0o700)


def test_export_and_report_paths(cli, workdir: Path) -> None:
    (workdir / "afile").write_text("x")
    assert_clean_error(cli("export", "no-run", "--out", "afile/adapter"), 2, "is a file")
    assert_clean_error(cli("report", "no-run"), 2, "run directory not found")
    assert_clean_error(cli("init", "afile", "--example", "grpo"), 2, "is a file")


def test_schemas_out_is_a_file(cli, workdir: Path) -> None:
    (workdir / "afile").write_text("x")
    assert_clean_error(cli("schemas", "--out", "afile"), 2, "afile is a file")
    assert (workdir / "afile").read_text() == "x"


def test_init_dir_that_cannot_be_created(cli, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory access() calls writable that still cannot be made (a virtual filesystem, say)."""

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert_clean_error(cli("init", "new-project", "--example", "grpo"), 2, "cannot create it (Permission denied)")


def test_data_sample_out_under_a_file(cli, workdir: Path) -> None:
    (workdir / "afile").write_text("x")
    result = cli("data", "sample", "--task", "calculator", "--rows", "2", "--out", "afile/p.parquet")
    assert_clean_error(result, 2, "--out afile/p.parquet: afile is a file")


def test_threads_must_be_positive(cli, planned: Path) -> None:
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a", "--threads", "0"), 2, "--threads")


def test_metrics_duplicate_keys_refused(tmp_path: Path) -> None:
    from miniverl.artifacts.rundir import read_metrics
    from miniverl.errors import UsageError

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1})[:-1] + ', "step": 2}\n')
    with pytest.raises(UsageError, match="line 1"):
        read_metrics(tmp_path)


def test_output_not_writable_as_root_too(cli, planned: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same path as above for a root user (who may write anywhere): os.access says no."""
    import miniverl.artifacts.rundir as rundir

    monkeypatch.setattr(rundir.os, "access", lambda *_a, **_k: False)
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a"), 2, "is not writable")


def test_reward_that_cannot_read_the_data_fails_at_plan(cli, write_config, tiny_model_dir, workdir: Path) -> None:
    from miniverl.data import write_prompts

    rows = [{"prompt_id": "p0", "prompt": "1+1?", "answer": "two", "context": "c", "task": "calculator"}]
    write_prompts(workdir / "prompts.parquet", rows)
    config = tiny_config(tiny_model_dir)
    config["algorithm"]["rewards"] = [{"name": "calculator_exact"}]
    write_config(config)
    assert_clean_error(_plan(cli), 2, "calculator answer 'two' (prompt p0) is not an integer")
