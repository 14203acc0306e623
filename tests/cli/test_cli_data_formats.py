"""A JSON Lines / CSV dataset with data.columns, through plan, run --dry-run and handoff (verl's parquet)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from miniverl.data.prompts import DEFAULT_TASK, derive_ids
from tests.conftest import tiny_config

ROWS = [
    {"question": "What is 2 + 3?", "solution": "5", "kind": "calculator", "note": "x"},
    {"question": "What is 7 - 4?", "solution": "3", "kind": "calculator", "note": "y"},
]
MAPPING = {"prompt": "question", "answer": "solution", "task": "kind"}


def _write_jsonl(path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")


def test_jsonl_with_a_mapping_plans_runs_and_hands_off(cli, write_config, tiny_model_dir, workdir: Path) -> None:
    _write_jsonl(workdir / "peer.jsonl")
    write_config(tiny_config(tiny_model_dir, data={"path": "peer.jsonl", "columns": MAPPING}))
    planned = cli("plan", "config.yaml", "--out", "plan.json")
    assert planned.code == 0, planned.err
    assert planned.err.count("notice:") == 1 and "ignoring column(s) note" in planned.err
    assert "error" not in planned.err
    dry = cli("run", "--plan", "plan.json", "--run-id", "r", "--dry-run", "--json")
    assert dry.code == 0 and dry.json()["rows"] == 2, dry.err
    handed = cli("handoff", "plan.json", "--out", "bundle", "--json")
    assert handed.code == 0, handed.err
    table = pq.read_table(workdir / "bundle" / "data" / "train.parquet").to_pylist()
    assert [t["prompt"][0]["content"] for t in table] == [r["question"] for r in ROWS]
    assert [t["reward_model"]["ground_truth"] for t in table] == ["5", "3"]
    assert [t["ability"] for t in table] == ["calculator", "calculator"]
    assert [t["extra_info"]["prompt_id"] for t in table] == derive_ids([r["question"] for r in ROWS])


def test_csv_without_task_hands_off_under_the_default_task(cli, write_config, tiny_model_dir, workdir: Path) -> None:
    (workdir / "p.csv").write_text("prompt,answer\nWhat is 1 + 1?,2\n", encoding="utf-8")
    write_config(tiny_config(tiny_model_dir, data={"path": "p.csv"}))
    assert cli("plan", "config.yaml", "--out", "plan.json").code == 0
    assert cli("handoff", "plan.json", "--out", "bundle").code == 0
    table = pq.read_table(Path("bundle") / "data" / "train.parquet").to_pylist()
    assert [t["data_source"] for t in table] == [f"miniverl/{DEFAULT_TASK}"]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.jsonl", '{"question": "a"}\n', "no 'prompt' column; its columns: question"),
        ("p.csv", "prompt\n", "the dataset is empty"),
        ("p.tsv", "prompt\na\n", "unknown dataset format '.tsv'"),
    ],
)
def test_a_bad_dataset_is_one_line_and_exit_2(
    cli, write_config, tiny_model_dir, workdir: Path, name: str, content: str, message: str
) -> None:
    (workdir / name).write_text(content, encoding="utf-8")
    write_config(tiny_config(tiny_model_dir, data={"path": name}))
    result = cli("plan", "config.yaml", "--out", "plan.json")
    assert result.code == 2
    assert result.err.count("\n") == 1 and message in result.err and result.err.startswith("miniverl: error:")
    assert not (workdir / "plan.json").exists()
