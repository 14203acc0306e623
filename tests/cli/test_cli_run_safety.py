"""Issue #20, the rest of "runs never corrupt": hostile checkpoint files, symlinked checkpoint dirs, a file size
limit and a read-only run dir mid-run, races inside the model load, a real SIGKILL during ``--extend``.

Every refusal is one ``miniverl: error:`` line; a refused command changes no file; a run broken by its
environment resumes, once the cause is lifted, to exactly what an uninterrupted run writes."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CliResult, tiny_config

REPO = Path(__file__).resolve().parents[2]
TIMINGS = {"rollout_seconds", "update_seconds", "cycle_seconds"}


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(t) for t in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in line.items() if k not in TIMINGS} for line in lines]


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (symlinks not followed), by relative path."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _miniverl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "miniverl", *argv], capture_output=True, text=True, env=_env(), timeout=300, check=False
    )


def _driven(
    action: str, phase: str, index: int, *argv: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process, ``action`` done at ``on_phase(phase, index)`` (tests/helpers/run_driver.py)."""
    command = [*prefix, sys.executable, "-m", "tests.helpers.run_driver", action, phase, str(index), "--", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=300, check=False)


def _one_line(result: subprocess.CompletedProcess[str] | CliResult, code: int, *needles: str) -> None:
    returncode = result.returncode if isinstance(result, subprocess.CompletedProcess) else result.code
    err = result.stderr if isinstance(result, subprocess.CompletedProcess) else result.err
    assert returncode == code, (returncode, err)
    assert err.count("\n") == 1 and err.startswith("miniverl: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err


# --------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Path]:
    """Plans of 2, 3 and 4 cycles (checkpoint each update, keep 1); ``runs/r`` and ``runs/four``: two.json and
    four.json, uninterrupted."""
    import torch

    from miniverl.cli import main
    from miniverl.data import sample_dataset

    root = tmp_path_factory.mktemp("safety")
    before, threads = Path.cwd(), torch.get_num_threads()
    os.chdir(root)
    torch.set_num_threads(1)
    try:
        sample_dataset("calculator", 8, 0, root / "prompts.parquet")
        config = tiny_config(tiny_model_dir, checkpoint={"every_updates": 1, "keep_last": 1})
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        for name, cycles in (("two", 2), ("three", 3), ("four", 4)):
            argv = ["plan", "config.yaml", "--out", f"{name}.json", "--set", f"train.cycles={cycles}", "--quiet"]
            assert main(argv) == 0
        assert main(["run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "--quiet"]) == 0
        assert main(["run", "--plan", "four.json", "--run-id", "four", "--threads", "1", "--quiet"]) == 0
    finally:
        os.chdir(before)
        torch.set_num_threads(threads)
    yield root


@pytest.fixture()
def work(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread: None) -> Path:
    """A private copy of ``project`` as the working directory; ``runs/once`` keeps the uninterrupted ``runs/r``
    (only its metrics are compared: they name no run)."""
    target = tmp_path / "p"
    shutil.copytree(project, target, symlinks=True)
    shutil.copytree(target / "runs" / "r", target / "runs" / "once", symlinks=True)
    monkeypatch.chdir(target)
    return target


RESUME = ("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "--resume", "-q")


# ------------------------------------------------------------------------------- hostile checkpoint files


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _oversized(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(17 * 1024 * 1024)  # sparse: nothing written


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (_fifo, "a checkpoint record must be a regular file; this is a FIFO"),
        (_dev_zero, "a checkpoint record must be a regular file; this is a symlink"),
        (_directory, "a checkpoint record must be a regular file; this is a directory"),
        (_oversized, "exceeds the 16 MiB limit for a checkpoint record"),
    ],
    ids=["fifo", "dev-zero", "directory", "oversized"],
)
def test_hostile_checkpoint_json_is_one_line_exit_2(
    work: Path, cli: Callable[..., CliResult], change: Callable[[Path], None], needle: str
) -> None:
    run_dir = work / "runs" / "r"
    change(run_dir / "checkpoints" / "step-000002" / "checkpoint.json")
    before = _files(run_dir)
    for argv in (RESUME, (*RESUME, "--extend", "1"), ("export", "runs/r", "--out", "e", "-q")):
        _one_line(cli(*argv), 2, "step-000002/checkpoint.json", needle)
    assert _files(run_dir) == before
    assert not (work / "e").exists()
    shown = cli("inspect", "runs/r", "--json")  # a reader reports it per checkpoint, and never blocks on it
    assert shown.code == 0, shown.err
    [checkpoint] = shown.json()["checkpoints"]
    assert checkpoint["state"] != "complete" and needle in checkpoint["reason"], checkpoint


# ------------------------------------------------------------------------------- symlinked checkpoint dirs


@pytest.mark.parametrize("link", ["checkpoints", "checkpoints/step-000002"])
def test_symlinked_checkpoint_dir_is_refused_and_nothing_is_lost(
    work: Path, cli: Callable[..., CliResult], link: str
) -> None:
    run_dir = work / "runs" / "r"
    elsewhere = work / "elsewhere"
    (run_dir / link).rename(elsewhere)
    (run_dir / link).symlink_to(elsewhere)
    run_before, elsewhere_before = _files(run_dir), _files(elsewhere)
    argvs = (
        RESUME,  # a completed run: verified before "nothing to do"
        (*RESUME, "--extend", "1"),  # would write step-000003 through the link and prune through it
        ("run", "--plan", "three.json", "--run-id", "r", "--resume", "-q"),
        ("export", "runs/r", "--out", "e", "-q"),
        ("inspect", "runs/r"),
    )
    for argv in argvs:
        _one_line(cli(*argv), 2, f"runs/r/{link} is a symlink", "inside its run directory")
    assert _files(run_dir) == run_before
    assert _files(elsewhere) == elsewhere_before
    assert (run_dir / link).is_symlink()
    # replaced by the directory it points to, as the message says: the run is whole again
    (run_dir / link).unlink()
    elsewhere.rename(run_dir / link)
    extended = cli(*RESUME[:-1], "--extend", "1", "--json")
    assert extended.code == 0 and extended.json()["updates"] == 3, extended.err


def test_write_checkpoint_refuses_a_symlinked_root(tmp_path: Path) -> None:
    """A link planted while a run trains: the next checkpoint is refused, nothing is written through it."""
    from miniverl.training.checkpoint import TrainingState, write_checkpoint
    from miniverl.training.checkpoint_files import CheckpointSymlinkError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "checkpoints").symlink_to(elsewhere)
    state = TrainingState(1, 1, 1, 2, "0" * 64, "0" * 64, {})
    with pytest.raises(CheckpointSymlinkError, match="is a symlink"):
        write_checkpoint(tmp_path / "checkpoints", state, {}, None, None)  # type: ignore[arg-type]
    assert list(elsewhere.iterdir()) == []


# ---------------------------------------------------------------------- the environment fails mid-run


def test_file_size_limit_mid_run_is_one_line_and_resumable(work: Path, cli: Callable[..., CliResult]) -> None:
    """``ulimit -f`` lowered after the first checkpoint: the second (its optimizer file is 72 kB) hits EFBIG."""
    shutil.rmtree(work / "runs" / "r")
    run = ("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "-q")
    broken = _driven("fsize:50000", "rollout", 1, *run)
    _one_line(broken, 2, "`ulimit -f`", "raise the limit", "--resume")
    run_dir = work / "runs" / "r"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]
    assert not (run_dir / "summary.json").exists()
    resumed = cli(*RESUME[:-1], "--json")  # the limit lifted
    assert resumed.code == 0 and resumed.json()["updates"] == 2, resumed.err
    assert _metrics(run_dir) == _metrics(work / "runs" / "once")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002"]
    assert (run_dir / "plan.json").read_bytes() == (work / "two.json").read_bytes()


def test_file_size_limit_from_the_start_leaves_nothing(work: Path, cli: Callable[..., CliResult]) -> None:
    """A limit the first checkpoint cannot fit: one line; the fresh run leaves no directory, and runs later."""
    import resource

    shutil.rmtree(work / "runs" / "r")
    argv = [sys.executable, "-m", "miniverl", "run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "-q"]

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    broken = subprocess.run(
        argv, capture_output=True, text=True, env=_env(), timeout=300, check=False, preexec_fn=limit
    )
    _one_line(broken, 2, "`ulimit -f`", "optimizer.safetensors")
    assert not (work / "runs" / "r").exists()
    again = cli(*RESUME[:-2], "--json")
    assert again.code == 0 and again.json()["updates"] == 2, again.err
    assert _metrics(work / "runs" / "r") == _metrics(work / "runs" / "once")


def _read_only_prefix() -> tuple[str, ...]:
    """How the driver gets a read-only run dir: root needs its own mount namespace (``unshare -m``)."""
    if os.geteuid() != 0:
        return ()
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("as root only a read-only mount stops writes, and unshare(1) is not installed")
    prefix = (unshare, "-m", "--propagation", "private")
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"as root only a read-only mount stops writes, and unshare -m is refused: {probe.stderr!r}")
    return prefix


def test_read_only_run_dir_mid_run_is_one_line_and_resumable(work: Path, cli: Callable[..., CliResult]) -> None:
    prefix = _read_only_prefix()
    shutil.rmtree(work / "runs" / "r")
    run_dir = work / "runs" / "r"
    run = ("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "-q")
    broken = _driven(f"readonly:{run_dir}", "rollout", 1, *run, prefix=prefix)
    if os.geteuid() == 0:
        _one_line(broken, 2, "read-only file system", "--resume")
    else:
        _one_line(broken, 2, "permission denied; fix the permissions", "--resume")
        for folder in [run_dir, *(p for p in run_dir.rglob("*") if p.is_dir())]:
            folder.chmod(0o755)  # fixed, as the line says
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000001"]
    resumed = cli(*RESUME[:-1], "--json")
    assert resumed.code == 0 and resumed.json()["updates"] == 2, resumed.err
    assert _metrics(run_dir) == _metrics(work / "runs" / "once")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002"]


# ------------------------------------------------------------------------------ races inside the model load


def _during_load(monkeypatch: pytest.MonkeyPatch, race: Callable[[], None]) -> list[int]:
    """Run ``race`` inside the next model load (before the weights are built), once; returns a call counter."""
    import miniverl.runtime

    original = miniverl.runtime.build_runtime
    calls: list[int] = []

    def build_runtime(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            race()
        return original(*args, **kwargs)

    monkeypatch.setattr(miniverl.runtime, "build_runtime", build_runtime)
    return calls


def test_writers_racing_a_fresh_run_inside_its_model_load_exit_2(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The original bug: a --resume while a fresh run loads its model deleted the live directory."""
    from miniverl.training.entry import run_from_plan

    shutil.rmtree(work / "runs" / "r")
    losers: dict[str, subprocess.CompletedProcess[str]] = {}

    def race() -> None:
        base = ("run", "--run-id", "r", "--threads", "1", "-q")
        losers["fresh"] = _miniverl(*base, "--plan", "two.json")
        losers["resume"] = _miniverl(*base, "--plan", "two.json", "--resume")
        losers["other_plan"] = _miniverl(*base, "--plan", "three.json", "--resume")
        losers["extend"] = _miniverl(*base, "--plan", "two.json", "--resume", "--extend", "2")

    calls = _during_load(monkeypatch, race)
    run_from_plan(Path("two.json"), output=Path("runs"), run_id="r")
    assert calls == [1]
    _one_line(losers["fresh"], 2, "already exists")
    for name in ("resume", "other_plan", "extend"):
        _one_line(losers[name], 2, f"being written by pid {os.getpid()}")
    run_dir = work / "runs" / "r"
    assert _metrics(run_dir) == _metrics(work / "runs" / "once")
    assert (run_dir / "plan.json").read_bytes() == (work / "two.json").read_bytes()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002"]
    assert not (run_dir / "extension.json").exists()


class _Killed(Exception):
    pass


def test_writers_racing_a_resume_inside_its_model_load_exit_2(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from miniverl.training.entry import run_from_plan

    shutil.rmtree(work / "runs" / "r")

    def kill(name: str, at: int) -> None:
        if (name, at) == ("rollout", 1):
            raise _Killed

    with pytest.raises(_Killed):  # killed after its first checkpoint
        run_from_plan(Path("two.json"), output=Path("runs"), run_id="r", on_phase=kill)
    losers: dict[str, subprocess.CompletedProcess[str]] = {}

    def race() -> None:
        base = ("run", "--run-id", "r", "--threads", "1", "-q", "--resume")
        losers["resume"] = _miniverl(*base, "--plan", "two.json")
        losers["other_plan"] = _miniverl(*base, "--plan", "three.json")

    _during_load(monkeypatch, race)
    run_from_plan(Path("two.json"), output=Path("runs"), run_id="r", resume=True)
    for name in ("resume", "other_plan"):
        _one_line(losers[name], 2, f"being written by pid {os.getpid()}")
    run_dir = work / "runs" / "r"
    assert _metrics(run_dir) == _metrics(work / "runs" / "once")
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002"]


# --------------------------------------------------------------------------- a real SIGKILL during --extend


def test_sigkill_during_extend_then_the_same_command_adds_exactly_n(work: Path, cli: Callable[..., CliResult]) -> None:
    extend = ("run", "--plan", "two.json", "--run-id", "r", "--threads", "1", "--resume", "--extend", "2", "-q")
    killed = _driven("sigkill", "update", 2, *extend)  # inside the first added cycle, before its checkpoint
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    run_dir = work / "runs" / "r"
    target = json.loads((run_dir / "extension.json").read_text())
    assert (target["from_cycles"], target["to_cycles"]) == (2, 4)
    retry = cli(*extend[:-1], "--json")  # the command, again, as the advice says
    assert retry.code == 0 and retry.json()["updates"] == 4, retry.err
    assert _metrics(run_dir) == _metrics(work / "runs" / "four")
    assert not (run_dir / "extension.json").exists()
    assert json.loads((run_dir / "plan.json").read_text())["cycles"] == 4


# ------------------------------------------------------------------- bounded reads outside the run command


def test_model_cache_record_and_files_never_block(tmp_path: Path) -> None:
    """A FIFO record, or a cached file that links to a FIFO: a mismatch (the cache is rebuilt), never a hang."""
    from miniverl.models.cache import (
        RECORD_NAME,
        CachedModelRecord,
        CacheMismatch,
        TokenizerFix,
        read_record,
        verify_cached_dir,
    )

    os.mkfifo(tmp_path / RECORD_NAME)
    with pytest.raises(CacheMismatch, match="this is a FIFO"):
        read_record(tmp_path)
    (tmp_path / RECORD_NAME).unlink()
    record = CachedModelRecord(
        source="gguf",
        name="gguf",
        gguf_sha256="0" * 64,
        gguf_size=1,
        dtype="bfloat16",
        recipe=1,
        tokenizer=TokenizerFix(eos_token="</s>", eos_token_id=2, pad_token="</s>", pad_token_id=2),
        files={"model.safetensors": "0" * 64},
    )
    (tmp_path / RECORD_NAME).write_text(record.model_dump_json())
    assert read_record(tmp_path) == record
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "model.safetensors").symlink_to(tmp_path / "pipe")
    with pytest.raises(CacheMismatch, match="this is a symlink"):
        verify_cached_dir(tmp_path, expect={})


def test_diagnose_reads_the_bundle_bounded(tmp_path: Path) -> None:
    from miniverl.bounded import InputBoundError
    from miniverl.handoff import diagnose

    os.mkfifo(tmp_path / "config.yaml")
    with pytest.raises(InputBoundError, match="a bundle's verl YAML must be a regular file; this is a FIFO"):
        diagnose._overlay_mismatches(tmp_path / "config.yaml", None)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").symlink_to("/dev/zero")
    with pytest.raises(InputBoundError, match="an adapter config must be a regular file; this is a character"):
        diagnose._check_adapter(tmp_path / "adapter", None)
    os.mkfifo(tmp_path / "reward_fn.py")
    with pytest.raises(InputBoundError, match="reward function must be a regular file; this is a FIFO"):
        diagnose._check_reward(tmp_path / "reward_fn.py")
    with open(tmp_path / "train.parquet", "wb") as handle:
        handle.truncate(5 * 1024**3)  # sparse
    with pytest.raises(InputBoundError, match="exceeds the 4 GiB limit for a bundle's dataset"):
        diagnose._check_dataset(tmp_path / "train.parquet")


def test_eval_adapter_json_is_bounded(tmp_path: Path) -> None:
    from miniverl.errors import UsageError
    from miniverl.evaluation import runner

    with open(tmp_path / "miniverl-manifest.json", "wb") as handle:
        handle.truncate(5 * 1024 * 1024)
    with pytest.raises(UsageError, match="exceeds the 4 MiB limit for an export manifest"):
        runner._check_provenance(tmp_path, "0" * 64)
    (tmp_path / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(UsageError, match="is not a JSON object"):
        runner._check_lora(tmp_path, None)  # type: ignore[arg-type]


def test_roll_back_refuses_a_fifo_metrics_without_reading_or_deleting(tmp_path: Path) -> None:
    from miniverl.artifacts.rundir import roll_back_outputs
    from miniverl.errors import UsageError

    os.mkfifo(tmp_path / "metrics.jsonl")
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "trajectories" / "later.jsonl").write_text("uncommitted\n")
    with pytest.raises(UsageError, match=r"metrics\.jsonl is a FIFO, not a regular file"):
        roll_back_outputs(tmp_path, '{"step": 1}\n', {}, "step-000001")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "metrics.jsonl").st_mode)
    assert (tmp_path / "trajectories" / "later.jsonl").is_file()  # nothing deleted before the refusal


def test_roll_back_refuses_a_directory_as_metrics(tmp_path: Path) -> None:
    from miniverl.artifacts.rundir import roll_back_outputs
    from miniverl.errors import UsageError

    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(
        UsageError, match=r"metrics\.jsonl is a directory, not a regular file this run wrote; remove it and resume"
    ):
        roll_back_outputs(tmp_path, '{"step": 1}\n', {}, "step-000001")
    assert (tmp_path / "metrics.jsonl").is_dir()
