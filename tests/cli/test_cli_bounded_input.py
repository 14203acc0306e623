"""Issue #20, bounded input: every hostile input is one `miniverl: error:` line and a documented exit code."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CliResult, tiny_config


def assert_one_line(result: CliResult, code: int, needle: str) -> None:
    assert result.code == code, (result.code, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("miniverl: error: "), lines[0]
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.err


# ------------------------------------------------------------------------------------------- inputs


def test_init_where_config_yaml_is_a_directory(cli: Callable[..., CliResult], workdir: Path) -> None:
    (workdir / "proj" / "config.yaml").mkdir(parents=True)
    assert_one_line(cli("init", "proj", "--example", "grpo"), 2, "config.yaml is a directory")
    assert_one_line(cli("init", "proj", "--example", "grpo", "--force"), 2, "config.yaml is a directory")
    assert (workdir / "proj" / "config.yaml").is_dir()


def test_lone_surrogate_in_set(cli: Callable[..., CliResult], workdir: Path) -> None:
    assert cli("init", ".", "--example", "grpo").code == 0
    result = cli("plan", "config.yaml", "--set", "run.name=\udcff", "--out", "p.json")
    assert_one_line(result, 2, "not a valid YAML scalar")


@pytest.mark.parametrize(
    "text",
    ["a: " + "[" * 5000 + "]" * 5000 + "\n", "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 400))],
    ids=["flow", "indented"],
)
def test_deep_yaml(cli: Callable[..., CliResult], workdir: Path, text: str) -> None:
    (workdir / "deep.yaml").write_text(text)
    assert_one_line(cli("plan", "deep.yaml", "--out", "p.json"), 2, "nested more than 64 levels deep")


def test_deep_json_plan(cli: Callable[..., CliResult], workdir: Path) -> None:
    (workdir / "plan.json").write_text("[" * 100_000 + "]" * 100_000)
    assert_one_line(cli("run", "--plan", "plan.json", "--run-id", "a", "--dry-run"), 2, "nested more than")


@pytest.mark.parametrize("where", ["config", "plan", "bindings", "native"])
def test_fifo_inputs_never_block(cli: Callable[..., CliResult], workdir: Path, where: str) -> None:
    os.mkfifo(workdir / "fifo")
    argv = {
        "config": ("plan", "fifo", "--out", "p.json"),
        "plan": ("run", "--plan", "fifo", "--run-id", "a"),
        "bindings": ("plan", "--verl-config", "native.yaml", "--bindings", "fifo", "--out", "p.json"),
        "native": ("plan", "--verl-config", "fifo", "--out", "p.json"),
    }[where]
    (workdir / "native.yaml").write_text("data: {}\n")
    assert_one_line(cli(*argv), 2, "must be a regular file; this is a FIFO")


def test_dev_zero_as_plan(cli: Callable[..., CliResult], workdir: Path) -> None:
    assert_one_line(cli("plan", "/dev/zero", "--out", "p.json"), 2, "this is a character device")
    assert_one_line(cli("run", "--plan", "/dev/zero", "--run-id", "a"), 2, "this is a character device")


def test_oversized_plan_names_the_bound(cli: Callable[..., CliResult], workdir: Path) -> None:
    with open(workdir / "plan.json", "wb") as handle:
        handle.truncate(17 * 1024 * 1024)  # sparse: no 17 MiB written
    result = cli("run", "--plan", "plan.json", "--run-id", "a", "--dry-run")
    assert_one_line(result, 2, "plan.json: 17.8 MB exceeds the 16 MiB limit for a plan")


def test_model_config_json_fifo(cli: Callable[..., CliResult], workdir: Path, tiny_model_dir: Path) -> None:
    model = workdir / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")
    from miniverl.data import sample_dataset

    sample_dataset("calculator", 4, 0, workdir / "prompts.parquet")
    (workdir / "c.yaml").write_text(yaml.safe_dump(tiny_config(model)))
    assert_one_line(cli("plan", "c.yaml", "--out", "p.json"), 2, "config.json: a model config must be a regular file")


def test_bundle_manifest_fifo(tmp_path: Path) -> None:
    from miniverl.errors import UsageError
    from miniverl.handoff.manifest import MANIFEST_NAME, read_manifest

    os.mkfifo(tmp_path / MANIFEST_NAME)
    with pytest.raises(UsageError, match="this is a FIFO"):
        read_manifest(tmp_path)


def test_bindings_with_a_missing_path(cli: Callable[..., CliResult], workdir: Path) -> None:
    (workdir / "native.yaml").write_text("data: {}\n")
    result = cli("plan", "--verl-config", "native.yaml", "--bindings", "typo.yaml", "--out", "p.json")
    assert_one_line(result, 2, "bindings file not found: typo.yaml")


def test_max_new_tokens_bounded(cli: Callable[..., CliResult], workdir: Path, tiny_model_dir: Path) -> None:
    from miniverl.data import sample_dataset

    sample_dataset("calculator", 4, 0, workdir / "prompts.parquet")
    (workdir / "c.yaml").write_text(yaml.safe_dump(tiny_config(tiny_model_dir)))
    huge = cli("plan", "c.yaml", "--set", "rollout.max_new_tokens=1000000000", "--out", "p.json")
    assert_one_line(huge, 2, "rollout.max_new_tokens: Input should be less than or equal to 131072")
    over = cli("plan", "c.yaml", "--set", "rollout.max_new_tokens=512", "--out", "p.json")
    assert_one_line(over, 2, "exceeds the limit of 511 for this student: its context is 512 tokens")
    assert not (workdir / "p.json").exists()
    no_room = cli("plan", "c.yaml", "--set", "rollout.max_new_tokens=511", "--out", "p.json")  # the prompts need room
    assert_one_line(no_room, 2, "tokens; the student's context of 512 less rollout.max_new_tokens 511 leaves 1")
    assert cli("plan", "c.yaml", "--set", "rollout.max_new_tokens=400", "--out", "p.json", "--quiet").code == 0


@pytest.mark.parametrize(
    "argv",
    [
        ("data", "sample", "--task", "calculator", "--rows", "10000000000000", "--out", "s.parquet"),
        ("eval", "run", "--data", "d.parquet", "--samples", "10000000000"),
        ("eval", "run", "--data", "d.parquet", "--max-new-tokens", "1000000000"),
        ("run", "--plan", "p.json", "--run-id", "a", "--threads", "100000000000"),
        ("eval", "run", "--data", "d.parquet", "--threads", "100000000000"),
    ],
    ids=["rows", "samples", "eval-max-new-tokens", "run-threads", "eval-threads"],
)
def test_count_arguments_have_maxima(cli: Callable[..., CliResult], workdir: Path, argv: tuple[str, ...]) -> None:
    assert_one_line(cli(*argv), 2, "exceeds the limit of")
    assert not (workdir / "s.parquet").exists()


@pytest.mark.parametrize(
    ("code", "advice"),
    [
        (errno.EFBIG, "ulimit -f"),
        (errno.ENOSPC, "free some space"),
        (errno.EROFS, "read-only file system"),
        (errno.EACCES, "fix the permissions"),
    ],
)
def test_environment_oserror_is_one_line(
    cli: Callable[..., CliResult], workdir: Path, monkeypatch: pytest.MonkeyPatch, code: int, advice: str
) -> None:
    import miniverl.examples

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), "runs/x/metrics.jsonl")

    monkeypatch.setattr(miniverl.examples, "write_example", fail)
    result = cli("init", "proj", "--example", "grpo")
    assert_one_line(result, 2, advice)
    assert "runs/x/metrics.jsonl" in result.err and "--resume" in result.err


def test_metrics_reader_refuses_binary_and_directories(tmp_path: Path) -> None:
    from miniverl.artifacts.rundir import read_metrics
    from miniverl.errors import UsageError

    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").rmdir()
    (tmp_path / "metrics.jsonl").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        read_metrics(tmp_path)


# ------------------------------------------------------------------------- a run's files and outputs


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Path]:
    """One tiny GRPO run (1 cycle) that each test copies before changing it."""
    from miniverl.cli import main
    from miniverl.data import sample_dataset

    root = tmp_path_factory.mktemp("bounded")
    before = Path.cwd()
    os.chdir(root)
    try:
        sample_dataset("calculator", 4, 0, root / "prompts.parquet")
        config = tiny_config(tiny_model_dir)
        config["train"]["cycles"] = 1
        (root / "c.yaml").write_text(yaml.safe_dump(config))
        assert main(["plan", "c.yaml", "--out", "p.json", "--quiet"]) == 0
        assert main(["run", "--plan", "p.json", "--output", "runs", "--run-id", "r", "--quiet", "--threads", "1"]) == 0
    finally:
        os.chdir(before)
    yield root / "runs" / "r"


@pytest.fixture()
def run_copy(trained: Path, tmp_path: Path) -> Path:
    target = tmp_path / "r"
    shutil.copytree(trained, target, symlinks=True)
    return target


def test_inspect_binary_metrics(cli: Callable[..., CliResult], run_copy: Path) -> None:
    (run_copy / "metrics.jsonl").write_bytes(b"\x00\xff\xfe" * 100)
    assert_one_line(cli("inspect", str(run_copy)), 2, "metrics.jsonl is not UTF-8 text")


def test_inspect_metrics_is_a_directory(cli: Callable[..., CliResult], run_copy: Path) -> None:
    (run_copy / "metrics.jsonl").unlink()
    (run_copy / "metrics.jsonl").mkdir()
    assert_one_line(cli("inspect", str(run_copy)), 2, "metrics.jsonl is a directory")
    assert_one_line(cli("report", str(run_copy)), 2, "metrics.jsonl is a directory")


def _rewrite_trajectories(run_dir: Path, change: Callable[[dict[str, Any]], None]) -> None:
    for path in (run_dir / "trajectories").glob("cycle-*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for record in records:
            change(record)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize(
    ("key", "value"),
    [("response_token_ids", 7), ("reward_components", [1, 2]), ("prompt_id", ["a"]), ("group_id", {"a": 1})],
)
def test_report_on_wrongly_typed_trajectory_fields(
    cli: Callable[..., CliResult], run_copy: Path, key: str, value: Any
) -> None:
    _rewrite_trajectories(run_copy, lambda record: record.__setitem__(key, value))
    assert_one_line(cli("report", str(run_copy)), 2, f"{key!r} must be")


def test_report_refuses_a_symlinked_report_dir(cli: Callable[..., CliResult], run_copy: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_copy / "report").symlink_to(elsewhere)
    assert_one_line(cli("report", str(run_copy)), 2, "is a symlink")
    assert list(elsewhere.iterdir()) == []


def test_report_refuses_a_symlinked_charts_dir(cli: Callable[..., CliResult], run_copy: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run_copy / "report").mkdir()
    (run_copy / "report" / "charts").symlink_to(elsewhere)
    assert_one_line(cli("report", str(run_copy)), 2, "charts is a symlink")
    assert list(elsewhere.iterdir()) == []
    out = tmp_path / "out"
    (out / "charts").mkdir(parents=True)
    (out / "charts").rmdir()
    (out / "charts").symlink_to(elsewhere)
    assert_one_line(cli("report", str(run_copy), "--out", str(out)), 2, "charts is a symlink")
    assert list(elsewhere.iterdir()) == []


def test_report_md_escapes_model_output(cli: Callable[..., CliResult], run_copy: Path) -> None:
    payload = "<img src=x onerror=alert(1)>"
    _rewrite_trajectories(run_copy, lambda record: record.__setitem__("response_text", payload))
    assert cli("report", str(run_copy), "--quiet").code == 0
    markdown = (run_copy / "report" / "report.md").read_text()
    assert f"` {payload} `" in markdown  # an inline code span: shown as text, never rendered as HTML
    assert payload not in (run_copy / "report" / "report.html").read_text()


def test_export_keeps_a_sibling_it_did_not_create(cli: Callable[..., CliResult], run_copy: Path) -> None:
    parent = run_copy.parent
    mine = parent / ".tmp-export-e"
    mine.mkdir()
    (mine / "keep.txt").write_text("not export's")
    result = cli("export", str(run_copy), "--out", str(parent / "e"), "--quiet")
    assert result.code == 0, result.err
    assert (mine / "keep.txt").read_text() == "not export's"
    assert (parent / "e" / "adapter_config.json").is_file()
    assert sorted(p.name for p in parent.iterdir()) == [".tmp-export-e", "e", "r"]


def _resume(cli: Callable[..., CliResult], run_copy: Path, trained: Path, monkeypatch: pytest.MonkeyPatch) -> CliResult:
    monkeypatch.chdir(trained.parent.parent)  # where the plan's data path is
    plan = str(run_copy / "plan.json")
    return cli("run", "--plan", plan, "--output", str(run_copy.parent), "--run-id", "r", "--resume", "--quiet")


def test_resume_recomputes_run_json_fields(cli, run_copy: Path, trained: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile class: edited run state. A derivable field of run.json that was edited is refused by inspect and
    --resume (one line, exit 2), never reported or trusted."""
    manifest = json.loads((run_copy / "run.json").read_text())
    assert _resume(cli, run_copy, trained, monkeypatch).code == 0  # the unedited run settles
    manifest["algorithm"] = "ppo"
    (run_copy / "run.json").write_text(json.dumps(manifest))
    assert_one_line(cli("inspect", str(run_copy)), 2, "algorithm 'ppo' is not the plan's 'grpo'")
    assert_one_line(_resume(cli, run_copy, trained, monkeypatch), 2, "run.json: algorithm is not what the plan gives")


def test_resume_recomputes_the_checkpoint_config_digest(
    cli, run_copy: Path, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (record_path,) = sorted((run_copy / "checkpoints").glob("step-*/checkpoint.json"))
    record = json.loads(record_path.read_text())
    record["config_digest"] = "0" * 64
    record_path.write_text(json.dumps(record))
    assert_one_line(_resume(cli, run_copy, trained, monkeypatch), 2, "config_digest 0000000000000000 is not its plan's")


@pytest.mark.parametrize("step", ['"x"', "null", "1" + "0" * 60, "2"])
def test_report_refuses_an_edited_metrics_step(cli, run_copy: Path, step: str) -> None:
    """Hostile class: edited run state. ``report`` checks metrics.jsonl as ``inspect`` does, step included."""
    path = run_copy / "metrics.jsonl"
    line = json.loads(path.read_text().splitlines()[0])
    path.write_text(json.dumps(line).replace(f'"step": {line["step"]}', f'"step": {step}') + "\n")
    result = cli("report", str(run_copy))
    assert_one_line(result, 2, "metrics.jsonl")
    assert not (run_copy / "report").exists()


@pytest.mark.parametrize("recompute", [False, True])
def test_export_refuses_an_edited_plan(cli, run_copy: Path, tmp_path: Path, recompute: bool) -> None:
    """Hostile class: edited run state. An edited plan.json (LoRA rank) is refused by export in one line, whether
    or not its plan_digest was recomputed, before any model loads."""
    from miniverl.canonical import sha256_json

    path = run_copy / "plan.json"
    plan = json.loads(path.read_text())
    plan["config"]["models"]["student"]["lora"]["r"] = 2 * plan["config"]["models"]["student"]["lora"]["r"]
    if recompute:
        plan["plan_digest"] = sha256_json({k: v for k, v in plan.items() if k != "plan_digest"})
    path.write_text(json.dumps(plan))
    needle = "not under" if recompute else "plan_digest does not verify"
    assert_one_line(cli("export", str(run_copy), "--out", str(tmp_path / "e")), 2, needle)
    assert not (tmp_path / "e").exists()


def test_eval_refuses_an_eval_dir_that_is_a_fifo_before_loading(cli, run_copy: Path, trained: Path) -> None:
    os.mkfifo(run_copy / "eval")
    result = cli("eval", str(run_copy), "--data", str(trained.parent.parent / "prompts.parquet"), "--samples", "0")
    assert_one_line(result, 2, "the eval record directory path is a FIFO, not a directory")
