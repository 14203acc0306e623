"""`miniverl eval RUN|ADAPTER --data` and `algorithm.eval_every` (tiny model, CPU)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import tiny_config

REWARDS = [
    {"name": "calculator_exact", "weight": 1.0},
    {"name": "tests.helpers.rewards:digit_fraction", "weight": 1.0},  # varies even for a random tiny model
]
TIMINGS = {"rollout_seconds", "update_seconds", "cycle_seconds"}


def _main(*argv: str) -> tuple[int, str, str]:
    from miniverl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Path]:
    """A 2-cycle GRPO run with `eval_every: 1` on a held-out file (and the same run without evaluation)."""
    import torch

    from miniverl.data import sample_dataset

    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("eval")
    before = Path.cwd()
    os.chdir(root)
    try:
        sample_dataset("calculator", 8, 0, root / "prompts.parquet")
        sample_dataset("calculator", 3, 7, root / "heldout.parquet")
        config = tiny_config(tiny_model_dir)
        config["algorithm"]["rewards"] = REWARDS
        config["rollout"]["samples_per_prompt"] = 4
        config["train"]["learning_rate"] = 0.05
        config["algorithm"]["eval_every"] = 1
        config["data"]["eval_path"] = "heldout.parquet"
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        code, _, err = _main("plan", "config.yaml", "--out", "plan.json", "-q")
        assert code == 0, err
        code, _, err = _main("run", "--plan", "plan.json", "--run-id", "r", "--threads", "1", "-q")
        assert code == 0, err
        code, _, err = _main("plan", "config.yaml", "--set", "algorithm.eval_every=null", "--out", "plain.json", "-q")
        assert code == 0, err
        code, _, err = _main("run", "--plan", "plain.json", "--run-id", "plain", "--threads", "1", "-q")
        assert code == 0, err
        yield root
    finally:
        os.chdir(before)
        torch.set_num_threads(threads)


def _eval(root: Path, *argv: str) -> tuple[int, str, str]:
    before = Path.cwd()
    os.chdir(root)
    try:
        return _main("eval", *argv, "--threads", "1")
    finally:
        os.chdir(before)


def test_eval_every_records_greedy_metrics(trained: Path) -> None:
    lines = [json.loads(t) for t in (trained / "runs" / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for line in lines:
        metrics = line["algorithm_metrics"]
        for key in ("eval/reward_mean", "eval/response_tokens_mean", "eval/calculator_exact/mean",
                    "eval/calculator_exact/fraction_positive", f"eval/{REWARDS[1]['name']}/mean"):  # fmt: skip
            assert key in metrics, sorted(metrics)
        assert 1 <= metrics["eval/response_tokens_mean"] <= 6
        assert line["adapter_delta_norm"] > 0


def test_eval_every_does_not_change_training(trained: Path) -> None:
    def lines(run: str) -> list[dict[str, Any]]:
        out = []
        for text in (trained / "runs" / run / "metrics.jsonl").read_text().splitlines():
            line = {k: v for k, v in json.loads(text).items() if k not in TIMINGS}
            line["algorithm_metrics"] = {
                k: v for k, v in line["algorithm_metrics"].items() if not k.startswith("eval/")
            }
            out.append(line)
        return out

    assert lines("r") == lines("plain")
    for name in ("cycle-000001.jsonl", "cycle-000002.jsonl"):
        assert (trained / "runs/r/trajectories" / name).read_bytes() == (
            trained / "runs/plain/trajectories" / name
        ).read_bytes()


def test_eval_run_against_base(trained: Path) -> None:
    code, out, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["source"] == {
        "kind": "run", "path": "runs/r", "step": 2,
        "plan_digest": json.loads((trained / "plan.json").read_text())["plan_digest"],
    }  # fmt: skip
    assert result["data"]["rows"] == 3 and result["rewards"] == [r["name"] for r in REWARDS]
    for mode, per_prompt in (("greedy", 1), ("sampled", 2)):
        base, trained_, diff = (result[mode][k] for k in ("base", "trained", "difference"))
        assert base["trajectories"] == trained_["trajectories"] == 3 * per_prompt
        assert diff["reward_mean"] == pytest.approx(trained_["reward_mean"] - base["reward_mean"])
        assert diff["response_tokens_mean"] == pytest.approx(
            trained_["response_tokens_mean"] - base["response_tokens_mean"]
        )
        assert base["components"]["calculator_exact"]["fraction_positive"] is not None
    # the trained greedy figures are the ones eval_every recorded after the last update
    last = json.loads((trained / "runs" / "r" / "metrics.jsonl").read_text().splitlines()[-1])["algorithm_metrics"]
    assert result["greedy"]["trained"]["reward_mean"] == pytest.approx(last["eval/reward_mean"])
    assert result["greedy"]["trained"]["response_tokens_mean"] == pytest.approx(last["eval/response_tokens_mean"])
    # sampling is seeded: the same command gives the same numbers
    code, again, _ = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--json")
    assert code == 0
    assert {k: v for k, v in json.loads(again).items() if k not in ("seconds", "torch_threads")} == {
        k: v for k, v in result.items() if k not in ("seconds", "torch_threads")
    }
    # adapter off: the base figures do not depend on the checkpoint; the trained ones do
    code, out, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--step", "1", "--json")
    assert code == 0, err
    step1 = json.loads(out)
    assert step1["greedy"]["base"] == result["greedy"]["base"]
    assert step1["sampled"]["base"] == result["sampled"]["base"]
    assert step1["sampled"]["trained"] != result["sampled"]["trained"]
    # readable table
    code, table, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "0")
    assert code == 0, err
    assert "greedy   reward (total)" in table and "calculator_exact accuracy (> 0)" in table
    assert "sampled" not in table and "response tokens" in table


def test_eval_exported_adapter_needs_config_and_matches_the_run(trained: Path) -> None:
    before = Path.cwd()
    os.chdir(trained)
    try:
        if not Path("adapter").exists():
            code, _, err = _main("export", "runs/r", "--out", "adapter", "-q")
            assert code == 0, err
    finally:
        os.chdir(before)
    code, _, err = _eval(trained, "adapter", "--data", "heldout.parquet")
    assert code == 2 and err.count("\n") == 1 and "--config" in err, err
    code, out, err = _eval(trained, "adapter", "--data", "heldout.parquet", "--config", "plan.json", "--samples", "0",
                           "--json")  # fmt: skip
    assert code == 0, err
    from_adapter = json.loads(out)
    code, out, _ = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "0", "--json")
    from_run = json.loads(out)
    assert from_adapter["source"]["kind"] == "adapter"
    assert from_adapter["greedy"] == from_run["greedy"]
    # provenance: an exported adapter refuses another run's plan; a config YAML is taken as given
    code, _, err = _eval(trained, "adapter", "--data", "heldout.parquet", "--config", "plain.json")
    assert code == 2 and "was exported from plan" in err and err.count("\n") == 1, err
    code, out, err = _eval(trained, "adapter", "--data", "heldout.parquet", "--config", "config.yaml", "--samples", "0",
                           "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["greedy"] == from_run["greedy"] and json.loads(out)["source"]["plan_digest"] is None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["nowhere", "--data", "heldout.parquet"], "is not a directory"),
        (["runs", "--data", "heldout.parquet"], "neither a run directory"),
        (["runs/r", "--data", "missing.parquet"], "--data missing.parquet"),
        (["runs/r", "--data", "heldout.parquet", "--samples", "-1"], "--samples -1"),
        (["runs/r", "--data", "heldout.parquet", "--step", "9"], "no checkpoint for step 9"),
        (["runs/r", "--data", "config.yaml"], "config.yaml"),
        (["runs/r", "--data", "heldout.parquet", "--config", "nope.yaml"], "--config nope.yaml"),
    ],
)
def test_eval_bad_input_exits_2(trained: Path, argv: list[str], needle: str) -> None:
    code, out, err = _eval(trained, *argv)
    assert code == 2, err
    assert out == "" and err.count("\n") == 1 and needle in err and "Traceback" not in err, err


def test_eval_every_needs_eval_path(trained: Path) -> None:
    before = Path.cwd()
    os.chdir(trained)
    try:
        code, _, err = _main("plan", "config.yaml", "--set", "data.eval_path=null", "--out", "x.json", "-q")
    finally:
        os.chdir(before)
    assert code == 2 and "data.eval_path" in err and err.count("\n") == 1, err


def test_eval_of_a_run_is_kept_in_the_run_and_reported(trained: Path) -> None:
    import hashlib

    from miniverl.evaluation.record import EvalRecord

    code, out, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--seed", "5", "--json")
    assert code == 0, err
    result = json.loads(out)
    path = trained / "runs" / "r" / "eval" / "step-000002.json"
    assert result["written"] == str(Path("runs/r/eval/step-000002.json"))
    text = path.read_text()
    assert str(trained) not in text  # no path of this machine
    record = EvalRecord.model_validate_json(text)
    assert record.run_id == "r" and record.step == 2 and record.seed == 5
    assert record.data.name == "heldout.parquet" and record.data.rows == 3
    assert record.data.sha256 == hashlib.sha256((trained / "heldout.parquet").read_bytes()).hexdigest()
    assert sorted(record.modes) == ["greedy", "sampled"]
    for mode, kept in record.modes.items():
        samples = {"greedy": 1, "sampled": 2}[mode]
        assert kept.decoding.samples == samples and kept.trained.trajectories == 3 * samples
        assert kept.model_dump(mode="json")["base"] == result[mode]["base"]
        assert kept.model_dump(mode="json")["trained"] == result[mode]["trained"]
    assert not list(path.parent.glob(".*.tmp"))
    # the table says where it was kept
    code, table, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--seed", "5")
    assert code == 0 and "kept in runs/r/eval/step-000002.json" in table, table
    # the report shows it: the held-out figure in the headline and a table per eval file
    code, out, err = _main("report", str(trained / "runs" / "r"), "--json")
    assert code == 0, err
    report = json.loads(out)
    accuracy = record.modes["greedy"]
    base = accuracy.base.components["calculator_exact"].fraction_positive
    after = accuracy.trained.components["calculator_exact"].fraction_positive
    assert report["evals"][-1] == 2  # earlier tests also kept step 1; the headline takes the latest
    assert report["headline"][-1] == (
        f"held-out accuracy (calculator_exact) {base:.3g} \u2192 {after:.3g} "
        "(greedy, 3 held-out prompts, base \u2192 step 2)"
    )
    html = (trained / "runs" / "r" / "report" / "report.html").read_text()
    assert "Step 2: base (adapter off) vs trained on heldout.parquet (3 rows, sha256 " + record.data.sha256 in html
    assert "seed 5" in html and "6 (3 prompts \u00d7 2)" in html and "calculator_exact accuracy (&gt; 0)" in html
    # eval_every's greedy figures are a curve of their own
    assert report["charts"]["eval_every"] >= 2 * 2  # reward_mean and calculator_exact accuracy, 2 updates each


def test_report_refuses_an_eval_file_that_is_not_a_record(trained: Path, tmp_path: Path) -> None:
    code, _, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "0", "-q")
    assert code == 0, err
    run = tmp_path / "r"
    shutil.copytree(trained / "runs" / "r", run, ignore=shutil.ignore_patterns("checkpoints", "report"))
    (run / "eval").mkdir(exist_ok=True)
    kept = sorted((run / "eval").glob("step-*.json"))[-1]
    (run / "eval" / "step-000009.json").write_text('{"kind": "miniverl.eval", "extra": 1}')
    code, out, err = _main("report", str(run))
    assert code == 2 and out == "" and err.count("\n") == 1 and "does not match the eval record schema" in err, err
    # another run's eval is not shown as this run's
    other = json.loads(kept.read_text())
    other["run_id"] = "someone-else"
    (run / "eval" / "step-000009.json").write_text(json.dumps(other))
    code, out, err = _main("report", str(run))
    assert code == 2 and out == "" and err.count("\n") == 1 and "is an eval of run 'someone-else'" in err, err


def _browser() -> Any:
    """Playwright's Chromium (its own download, else the system's), or skip."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    manager = playwright.sync_playwright().start()
    system = shutil.which("chromium") or shutil.which("chromium-browser")
    for options in ({}, {"executable_path": system} if system else None):
        if options is None:
            continue
        try:
            return manager, manager.chromium.launch(args=["--no-sandbox"], **options)
        except Exception:  # a missing browser shows as several error types
            continue
    manager.stop()
    pytest.skip("no Chromium for playwright (python -m playwright install chromium, or apt-get install chromium)")


def test_report_renders_in_a_headless_browser(trained: Path, tmp_path: Path) -> None:
    manager, browser = _browser()
    try:
        code, _, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--seed", "5", "-q")
        assert code == 0, err
        code, _, err = _main("report", str(trained / "runs" / "r"), "--quiet")
        assert code == 0, err
        page = browser.new_page(viewport={"width": 1000, "height": 1400})
        page.goto((trained / "runs" / "r" / "report" / "report.html").resolve().as_uri())
        headline = page.inner_text("#headline")
        assert headline.startswith("training reward ") and "held-out accuracy (calculator_exact)" in headline
        charts = page.query_selector_all("figure svg")
        assert len(charts) >= 8
        for chart in charts:
            box = chart.bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 150
            # something is drawn inside the plot: points with a real size on the page
            point = chart.query_selector("circle.pt")
            assert point is not None and (point.bounding_box() or {}).get("width", 0) > 0
        assert page.query_selector_all("line.grid") and page.query_selector("table.eval") is not None
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 20_000
    finally:
        browser.close()
        manager.stop()


def test_eval_not_kept_when_the_run_cannot_be_written(
    trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from miniverl.evaluation import record as kept

    code, out, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "0", "--json")
    assert code == 0, err
    result = json.loads(out)
    run = trained / "runs" / "r"
    path = run / "eval" / "step-000002.json"
    before = path.read_bytes()

    def read_only(*_: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(kept, "write_eval", read_only)
    assert kept.keep_in_run(run, result) is None
    notice = capsys.readouterr().err
    assert notice.startswith("notice: the eval was not kept in ") and "Read-only file system" in notice
    assert notice.count("\n") == 1 and path.read_bytes() == before


def test_eval_columns_maps_another_files_names(trained: Path, tmp_path: Path) -> None:
    """`eval --columns prompt=question,answer=solution` reads a file with other column names (issue #37); without
    it the error names --columns, the option an existing run's eval can take."""
    import pyarrow.parquet as pq

    rows = pq.read_table(trained / "heldout.parquet").to_pylist()
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text("".join(json.dumps({"question": r["prompt"], "solution": r["answer"]}) + "\n" for r in rows))
    code, _, err = _eval(trained, "runs/r", "--data", str(renamed), "--samples", "0")
    assert code == 2 and err.count("\n") == 1 and "--columns prompt=question,answer=solution" in err, err
    code, out, err = _eval(trained, "runs/r", "--data", str(renamed), "--columns", "prompt=question,answer=solution",
                           "--samples", "0", "--json")  # fmt: skip
    assert code == 0, err
    mapped = json.loads(out)["greedy"]
    code, out, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "0", "--json")
    assert code == 0, err
    assert mapped == json.loads(out)["greedy"]  # the same prompts and answers: the same figures
