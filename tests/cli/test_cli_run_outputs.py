"""A real (tiny) run through the CLI: progress lines, the report, inspect, export naming its base,
and `--resume` of a completed run changing no file."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.conftest import tiny_config


def _main(*argv: str) -> tuple[int, str, str]:
    from miniverl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[dict[str, Any]]:
    """One GRPO run (2 cycles, plain progress on stderr) and one OPD run (1 cycle, --json)."""
    import torch

    from miniverl.data import sample_dataset

    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("runs")
    found: dict[str, Any] = {"root": root}
    with _cwd(root):
        sample_dataset("calculator", 8, 0, root / "prompts.parquet")
        for algorithm, cycles in (("grpo", 2), ("opd", 1)):
            config = tiny_config(tiny_model_dir, algorithm=algorithm)
            config["train"]["cycles"] = cycles
            (root / f"{algorithm}.yaml").write_text(yaml.safe_dump(config))
            code, _, err = _main("plan", f"{algorithm}.yaml", "--out", f"{algorithm}.json", "--quiet")
            assert code == 0, err
            argv = ["run", "--plan", f"{algorithm}.json", "--run-id", algorithm, "--threads", "1"]
            if algorithm == "opd":
                argv.append("--json")
            code, out, err = _main(*argv)
            assert code == 0, err
            found[algorithm] = {"dir": root / "runs" / algorithm, "out": out, "err": err}
    torch.set_num_threads(threads)
    yield found


def test_plain_progress_lines_when_not_a_tty(runs: dict[str, Any]) -> None:
    lines = runs["grpo"]["err"].splitlines()
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ miniverl: ")
    assert lines and all(stamp.match(line) for line in lines), lines
    text = "\n".join(lines)
    for needle in ("load: dual_model runtime on cpu (threads 1)", "cycle 1/2 rollout", "cycle 1/2 update",
                   "cycle 1/2 checkpoint", "cycle 2/2  loss", "ETA 0m00s"):  # fmt: skip
        assert needle in text, text
    assert runs["grpo"]["out"].startswith("run grpo completed")


def test_json_run_is_silent_on_stderr(runs: dict[str, Any]) -> None:
    assert runs["opd"]["err"] == ""
    payload = json.loads(runs["opd"]["out"])
    assert payload["torch_threads"] == {"threads": 1, "from": "--threads"}
    assert payload["summary"]["torch_threads"] == 1
    # the run's own peak RSS (this process's ru_maxrss when the run ended: never above it now)
    from miniverl.runtime.host_memory import peak_rss_bytes

    assert 50 * 2**20 < payload["summary"]["peak_rss_bytes"] <= peak_rss_bytes()


def test_quiet_and_rich_reporters() -> None:
    from miniverl import progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert type(progress.choose(quiet=True, stream=Tty())) is progress.Reporter
    assert isinstance(progress.choose(quiet=False, stream=io.StringIO()), progress.PlainReporter)
    stream = Tty()
    rich = progress.choose(quiet=False, stream=stream)
    assert isinstance(rich, progress.RichReporter)
    line = SimpleNamespace(loss=0.5, reward_mean=0.25, kl=0.01, response_tokens=64, cycle_seconds=2.0)
    with progress.active(rich):
        progress.phase("load", "model")
        progress.start_cycles(0, 2)
        progress.phase("rollout", "8 sequences")
        progress.cycle_done(1, 2, line)
        assert rich.eta_seconds() == 2.0
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    for needle in ("cycle 1/2  loss 0.5000", "kl 0.0100", "rollout 8 sequences"):  # lines wrap at 80 columns
        assert needle in shown, shown
    assert "ETA 0m02s" in shown
    progress.phase("after", "no reporter active: nothing happens")


def _snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {
        p.relative_to(directory).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_resume_of_a_completed_run_changes_no_file(runs: dict[str, Any]) -> None:
    root: Path = runs["root"]
    before = _snapshot(root / "runs")
    with _cwd(root):
        code, out, err = _main("run", "--plan", "grpo.json", "--run-id", "grpo", "--resume", "--json")
    assert code == 0, err
    assert json.loads(out)["status"] == "completed" and json.loads(out)["resumed"] is False
    assert _snapshot(root / "runs") == before


def test_inspect_shows_the_objective(runs: dict[str, Any]) -> None:
    code, out, _ = _main("inspect", str(runs["opd"]["dir"]), "--json")
    objective = json.loads(out)["objective"]
    assert code == 0 and objective["metric"] == "kl" and objective["by_update"][0] > 0
    code, out, _ = _main("inspect", str(runs["opd"]["dir"]))
    assert "objective kl (minimized)" in out and "update 1: kl " in out


def test_report_has_points_and_names_what_is_absent(runs: dict[str, Any]) -> None:
    run_dir: Path = runs["grpo"]["dir"]
    code, out, err = _main("report", str(run_dir), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["charts"]["reward_mean"] == 2 and result["charts"]["grad_norm"] == 2
    assert result["charts"]["reward_components"] == 2 and result["charts"]["time_per_phase"] == 6
    assert "kl" in result["absent"]  # GRPO without a reference: no KL
    assert result["charts"]["entropy"] == 2  # recorded as the algorithm's actor/entropy
    assert result["headline"][0].startswith("training reward ") and result["headline"][0].endswith(" over 2 updates")
    assert result["headline"][-1].startswith("held-out: not evaluated") and result["evals"] == []
    assert result["time"]["cycles_timed"] == 2 and result["time"]["cycle_seconds_total"] > 0
    html = (run_dir / "report" / "report.html").read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert html.count('class="pt"') >= 2 * 8
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["plan_digest"] in html and "Sample trajectories, cycle 1" in html and "cycle 2" in html
    # the answer first, the identities last
    order = [html.index(n) for n in ("id='headline'", "<h2>Curves", "Held-out evaluation", "<h2>Time", "Identities")]
    assert order == sorted(order) and html.index(plan["plan_digest"]) > order[-1]
    markdown = (run_dir / "report" / "report.md").read_text()
    for name in re.findall(r"\]\((charts/[^)]+\.svg)\)", markdown):
        assert '<circle class="pt"' in (run_dir / "report" / name).read_text()
    assert str(runs["root"]) not in markdown


def test_report_prints_its_headline_then_where_it_wrote(runs: dict[str, Any]) -> None:
    run_dir: Path = runs["grpo"]["dir"]
    code, out, err = _main("report", str(run_dir))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("training reward ") and lines[0].endswith(" over 2 updates")
    assert lines[-2].startswith("held-out: not evaluated")
    assert lines[-1] == f"wrote {run_dir / 'report' / 'report.html'} and {run_dir / 'report' / 'report.md'}"


def test_report_renders_in_headless_chromium(runs: dict[str, Any], tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install -y chromium)")
    run_dir: Path = runs["grpo"]["dir"]
    _main("report", str(run_dir), "--quiet")
    page = (run_dir / "report" / "report.html").resolve().as_uri()
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--dump-dom", page], capture_output=True, text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="pt"') >= 16 and "<svg" in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run([*common, f"--screenshot={shot}", "--window-size=1000,1400", page], capture_output=True,
                   timeout=120, check=False)  # fmt: skip
    assert shot.is_file() and shot.stat().st_size > 10_000


def test_export_names_its_base(runs: dict[str, Any], tiny_model_dir: Path) -> None:
    out = runs["root"] / "adapter"
    code, _, err = _main("export", str(runs["grpo"]["dir"]), "--out", str(out), "--json")
    assert code == 0, err
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == tiny_model_dir.name
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(out))
    assert model.peft_config["default"].base_model_name_or_path == tiny_model_dir.name


def test_export_base_reference_for_each_source() -> None:
    from miniverl.artifacts.export import base_reference
    from miniverl.config.schema import ModelSpec

    rev = "a" * 40
    assert base_reference(ModelSpec(source="hub", model_id="org/m", revision=rev)) == ("org/m", rev)
    builtin = ModelSpec(source="builtin", model_id="smollm2-135m-instruct")
    assert base_reference(builtin) == ("HuggingFaceTB/SmolLM2-135M-Instruct", None)  # the released model's hub id
    assert base_reference(ModelSpec(source="local", path="/abs/where/model-dir")) == ("model-dir", None)


def test_inspect_counts_only_committed_updates(runs: dict[str, Any], tmp_path: Path) -> None:
    """A kill between a step's metrics write and its checkpoint leaves one line that --resume rolls back;
    inspect does not count it as an update."""
    import shutil

    run_dir = shutil.copytree(runs["grpo"]["dir"], tmp_path / "grpo")
    code, out, _ = _main("inspect", str(run_dir), "--json")
    before = json.loads(out)
    metrics = run_dir / "metrics.jsonl"
    last = metrics.read_text().splitlines()[-1]
    metrics.write_text(metrics.read_text() + last.replace('"step":', '"step":9', 1) + "\n")
    code, out, err = _main("inspect", str(run_dir), "--json")
    after = json.loads(out)
    assert code == 0, err
    assert after["updates"] == before["updates"] == after["last_complete_step"]
    assert after["uncommitted_metrics_lines"] == 1 and before["uncommitted_metrics_lines"] == 0


def test_grpo_logs_entropy_and_response_length(runs: dict[str, Any]) -> None:
    """GRPO's surrogate loss is no learning curve; the metrics verl logs sit beside it."""
    lines = [json.loads(line) for line in (runs["grpo"]["dir"] / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        extra = line["algorithm_metrics"]
        assert extra["actor/entropy"] > 0 and extra["actor/pg_loss"] == line["loss"]
        assert extra["response_length/mean"] == line["response_tokens"] / line["trajectories"]


def test_export_model_card_says_what_the_builtin_base_was() -> None:
    """The adapter names the released model (loads anywhere), and its card says training used the GGUF copy."""
    from miniverl.artifacts.export import model_card
    from miniverl.config.schema import ModelSpec
    from miniverl.models.builtin import SMOLLM2_135M_INSTRUCT as pin

    card = model_card(ModelSpec(source="builtin", model_id=pin.name), {"source": "builtin", "gguf_sha256": "x"})
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n")
    assert "is not the released `HuggingFaceTB/SmolLM2-135M-Instruct` weights" in card
    assert pin.gguf_sha256 in card and "Q4_1" in card and 'dtype="float32"' in card
    local = model_card(ModelSpec(source="local", path="/abs/where/model-dir"), {})
    assert "base_model: model-dir" in local and "/abs" not in local and "not the released" not in local
