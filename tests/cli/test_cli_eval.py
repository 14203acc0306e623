"""`miniverl eval RUN|ADAPTER --data` and `algorithm.eval_every` (tiny model, CPU)."""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_config

REWARDS = [
    {"name": "calculator_exact", "weight": 1.0},
    {"name": "target_length", "weight": 0.5, "params": {"target_tokens": 3}},
]


def _main(*argv: str) -> tuple[int, str, str]:
    from miniverl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[Path]:
    """A 2-cycle GRPO run with `eval_every: 1` on a held-out file; yields the working directory."""
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
        config["algorithm"]["eval_every"] = 1
        config["data"]["eval_path"] = "heldout.parquet"
        (root / "config.yaml").write_text(yaml.safe_dump(config))
        code, _, err = _main("plan", "config.yaml", "--out", "plan.json", "-q")
        assert code == 0, err
        code, _, err = _main("run", "--plan", "plan.json", "--run-id", "r", "--threads", "1", "-q")
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
                    "eval/calculator_exact/fraction_positive", "eval/target_length/mean"):  # fmt: skip
            assert key in metrics, sorted(metrics)
        assert 1 <= metrics["eval/response_tokens_mean"] <= 6


def test_eval_run_against_base(trained: Path) -> None:
    code, out, err = _eval(trained, "runs/r", "--data", "heldout.parquet", "--samples", "2", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["source"] == {
        "kind": "run", "path": "runs/r", "step": 2,
        "plan_digest": json.loads((trained / "plan.json").read_text())["plan_digest"],
    }  # fmt: skip
    assert result["data"]["rows"] == 3 and result["rewards"] == ["calculator_exact", "target_length"]
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
