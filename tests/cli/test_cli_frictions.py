"""The small frictions of a first run (issue 22), each pinned: exit codes, wording, file modes, plain text."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture()
def umask_027() -> Iterator[None]:
    before = os.umask(0o027)
    try:
        yield
    finally:
        os.umask(before)


def _modes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def _one_run(cli, tiny_model_dir: Path, workdir: Path, cycles: int = 1) -> None:
    config = tiny_config(tiny_model_dir)
    config["train"]["cycles"] = cycles
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    assert cli("plan", "config.yaml", "--out", "plan.json", "--quiet").code == 0
    result = cli("run", "--plan", "plan.json", "--run-id", "first", "--threads", "1", "--quiet")
    assert result.code == 0, result.err


def test_outputs_follow_the_users_umask(cli, tiny_model_dir, prompts, workdir: Path, umask_027) -> None:
    _one_run(cli, tiny_model_dir, workdir)
    assert cli("export", "runs/first", "--out", "adapter", "--quiet").code == 0
    assert cli("data", "sample", "--task", "calculator", "--rows", "2", "--out", "more.parquet").code == 0
    modes = {**_modes(workdir / "runs"), **{f"adapter/{k}": v for k, v in _modes(workdir / "adapter").items()}}
    modes |= {name: stat.S_IMODE((workdir / name).stat().st_mode) for name in ("plan.json", "more.parquet")}
    assert "first/checkpoints/step-000001/checkpoint.json" in modes and "adapter/adapter_config.json" in modes
    for name, mode in modes.items():
        path = workdir / ("runs" if not name.startswith(("adapter", "plan", "more")) else "") / name
        want = 0o750 if path.is_dir() else 0o640  # neither mkstemp's 0600 nor mkdtemp's 0700
        assert mode == want, f"{name}: {oct(mode)}"


def test_resume_with_a_changed_plan_names_the_way_out(cli, tiny_model_dir, prompts, workdir: Path) -> None:
    _one_run(cli, tiny_model_dir, workdir)
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    config["train"]["learning_rate"] = 0.02
    (workdir / "changed.yaml").write_text(yaml.safe_dump(config))
    assert cli("plan", "changed.yaml", "--out", "changed.json", "--quiet").code == 0
    result = cli("run", "--plan", "changed.json", "--run-id", "first", "--resume")
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    for needle in ("belongs to another plan", "--plan runs/first/plan.json --resume", "--extend N", "another --run-id"):
        assert needle in result.err, result.err
    assert cli("run", "--plan", "runs/first/plan.json", "--run-id", "first", "--resume", "--extend", "1").code == 0


def test_usage_errors_exit_2(cli, tiny_model_dir, prompts, workdir: Path) -> None:
    (workdir / "config.yaml").write_text(yaml.safe_dump(tiny_config(tiny_model_dir)))
    assert cli("plan", "config.yaml", "--out", "plan.json", "--quiet").code == 0
    missing = cli("run", "--plan", "plan.json", "--run-id", "never", "--resume")
    assert missing.code == 2 and "nothing to resume" in missing.err and missing.err.count("\n") == 1
    unknown = cli("models", "fetch", "no-such-model")
    assert unknown.code == 2 and unknown.err.count("\n") == 1
    assert "unknown model 'no-such-model'; known: distilbert-sst2, qwen3-0.6b, smollm2-135m-instruct" in unknown.err


def test_rewards_list_is_plain_text(cli) -> None:
    result = cli("rewards", "list")
    assert result.code == 0 and "`" not in result.out.replace("'package.module:function'", "")
    assert "final integer of response equals answer" in result.out
    assert "``" not in str(cli("rewards", "list", "--json").json())


def test_inspect_names_an_unrecorded_metric_once(cli, tiny_model_dir, prompts, workdir: Path) -> None:
    _one_run(cli, tiny_model_dir, workdir, cycles=2)
    out = cli("inspect", "runs/first").out
    assert out.count("not recorded: kl") == 1 and "absent" not in out, out
    updates = [line for line in out.splitlines() if line.strip().startswith("update ")]
    assert len(updates) == 2 and all("loss " in u and "reward mean " in u and "kl" not in u for u in updates)


def test_an_interrupted_extension_names_the_same_command_which_finishes_its_target(tmp_path: Path) -> None:
    """Ctrl-C during `--resume --extend N` prints that command again (the recorded target makes it idempotent:
    `test_cli_run_lock::test_killed_extension_retried_adds_exactly_n`), never a bare --resume."""
    import argparse

    from miniverl.cli.failures import interrupted_message

    (tmp_path / "runs" / "first").mkdir(parents=True)
    args = argparse.Namespace(command="run", dry_run=False, plan="runs/first/plan.json", output=str(tmp_path / "runs"),
                              run_id="first", threads=None, extend=2)  # fmt: skip
    line = interrupted_message(args)
    assert line.endswith("--run-id first --resume --extend 2`") and "the same command finishes the extension" in line
    args.extend = None
    assert interrupted_message(args).endswith("--run-id first --resume`")
