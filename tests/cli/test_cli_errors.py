"""Every bad input: one clear line on stderr, a non-zero exit, no traceback, no partial output."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import CliResult, tiny_config


def assert_clean_error(result: CliResult, code: int, needle: str) -> None:
    assert result.code == code, (result.code, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("miniverl: error: "), lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.err
    assert result.out == ""


def test_version(cli: Callable[..., CliResult]) -> None:
    from miniverl import __version__

    result = cli("--version")
    assert result.out.strip() == __version__


def test_doctor_json(cli: Callable[..., CliResult]) -> None:
    report = cli("doctor", "--json").json()
    assert set(report["capabilities"]) == {"cpu_training", "gpu_training", "nf4"}
    assert report["versions"]["torch"]


def test_unknown_command(cli: Callable[..., CliResult]) -> None:
    assert_clean_error(cli("frobnicate"), 2, "invalid choice")


def test_malformed_yaml(cli: Callable[..., CliResult], workdir: Path) -> None:
    (workdir / "c.yaml").write_text("models: [\n")
    assert_clean_error(cli("plan", "c.yaml", "--out", "plan.json"), 2, "malformed YAML")
    assert not (workdir / "plan.json").exists()


def test_unknown_key_and_wrong_type(cli: Callable[..., CliResult], write_config, tiny_model_dir, prompts) -> None:
    config = tiny_config(tiny_model_dir)
    config["train"]["speed"] = "fast"
    write_config(config)
    assert_clean_error(cli("plan", "config.yaml", "--out", "plan.json"), 2, "unknown key 'train.speed'")
    config["train"].pop("speed")
    write_config(config)
    assert_clean_error(cli("plan", "config.yaml", "--set", "train.cycles=two", "--out", "plan.json"), 2, "train.cycles")


def test_mutable_revision(cli: Callable[..., CliResult], write_config, prompts) -> None:
    write_config(
        {
            "models": {"student": {"source": "hub", "model_id": "org/m", "revision": "main"}},
            "data": {"path": "prompts.parquet"},
        }
    )
    assert_clean_error(cli("plan", "config.yaml"), 2, "mutable")


def test_missing_model(cli: Callable[..., CliResult], write_config, workdir: Path, prompts) -> None:
    write_config(tiny_config(workdir / "no-such-model"))
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert_clean_error(result, 1, "no-such-model")
    assert not (workdir / "plan.json").exists()


def test_data_changed_since_plan(cli: Callable[..., CliResult], write_config, tiny_model_dir, prompts, workdir) -> None:
    write_config(tiny_config(tiny_model_dir))
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    from miniverl.data import sample_dataset

    sample_dataset("calculator", 9, 1, prompts)
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a", "--dry-run"), 2, "changed since")
    assert not (workdir / "runs").exists()


def test_tampered_plan(cli: Callable[..., CliResult], write_config, tiny_model_dir, prompts, workdir) -> None:
    write_config(tiny_config(tiny_model_dir))
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    plan = json.loads((workdir / "plan.json").read_text())
    plan["updates"] = 99
    (workdir / "plan.json").write_text(json.dumps(plan))
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a", "--dry-run"), 2, "plan_digest")


def test_wrong_parquet_columns(cli: Callable[..., CliResult], write_config, tiny_model_dir, workdir) -> None:
    pq.write_table(pa.table({"question": ["1+1"], "solution": ["2"]}), workdir / "prompts.parquet")
    write_config(tiny_config(tiny_model_dir))
    assert_clean_error(cli("plan", "config.yaml", "--out", "plan.json"), 2, "no 'prompt' column")


def test_empty_dataset(cli: Callable[..., CliResult], write_config, tiny_model_dir, workdir) -> None:
    from miniverl.data import COLUMNS

    pq.write_table(pa.table({c: pa.array([], pa.string()) for c in COLUMNS}), workdir / "prompts.parquet")
    write_config(tiny_config(tiny_model_dir))
    assert_clean_error(cli("plan", "config.yaml", "--out", "plan.json"), 2, "empty")


def test_resume_without_checkpoint(cli: Callable[..., CliResult], write_config, tiny_model_dir, prompts) -> None:
    write_config(tiny_config(tiny_model_dir))
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    assert_clean_error(cli("run", "--plan", "plan.json", "--run-id", "a", "--resume"), 2, "nothing to resume")


def test_data_sample_bad_task_keeps_existing_file(cli: Callable[..., CliResult], workdir: Path) -> None:
    (workdir / "keep.parquet").write_bytes(b"precious")
    assert_clean_error(cli("data", "sample", "--task", "poetry", "--rows", "4", "--out", "keep.parquet"), 2, "poetry")
    assert (workdir / "keep.parquet").read_bytes() == b"precious"


def test_installed_executable_prints_no_traceback(tmp_path: Path) -> None:
    import subprocess

    exe = shutil.which("miniverl")
    if exe is None:
        pytest.skip("miniverl is not installed as an executable in this environment")
    proc = subprocess.run([exe, "plan", str(tmp_path / "absent.yaml")], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
