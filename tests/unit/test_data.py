"""Prompt datasets: deterministic Parquet, round trips, and one clear DataError per bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from miniverl.canonical import sha256_file
from miniverl.data import COLUMNS, PromptRow, describe_dataset, load_prompts, sample_dataset, write_prompts
from miniverl.errors import DataError, UsageError
from miniverl.rewards import generate_calculator_problems

REPO = Path(__file__).resolve().parents[2]


def _row(i: int, **changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "prompt_id": f"p{i}",
        "prompt": f"What is {i} + 1?",
        "answer": str(i + 1),
        "context": "",
        "task": "calculator",
    }
    row.update(changes)
    return row


def _write_raw(path: Path, columns: dict[str, list[object]], schema: pa.Schema | None = None) -> Path:
    pq.write_table(pa.table(columns, schema=schema), path)
    return path


def test_sample_dataset_round_trip_and_byte_identical(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "prompts.parquet"
    result = sample_dataset("calculator", 16, 0, out)
    assert result == {"path": str(out), "rows": 16, "sha256": sha256_file(out), "task": "calculator", "seed": 0}
    rows = load_prompts(out)
    assert [r.to_dict() for r in rows] == generate_calculator_problems(16, 0)
    assert all(isinstance(r, PromptRow) for r in rows)
    with pytest.raises(AttributeError):
        rows[0].prompt = "changed"  # type: ignore[misc]

    again = sample_dataset("calculator", 16, 0, tmp_path / "again.parquet")
    assert again["sha256"] == result["sha256"]
    assert (tmp_path / "again.parquet").read_bytes() == out.read_bytes()
    # rewriting loaded rows reproduces the bytes too
    assert write_prompts(tmp_path / "rewritten.parquet", rows) == result["sha256"]
    assert sample_dataset("calculator", 16, 1, tmp_path / "other.parquet")["sha256"] != result["sha256"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["prompts.parquet"]  # no temp file left behind

    assert describe_dataset(out) == {"rows": 16, "sha256": result["sha256"], "columns": list(COLUMNS)}
    meta = pq.read_metadata(out)
    assert meta.num_row_groups == 1 and set(meta.metadata) == {b"ARROW:schema"}


def test_formatting_task_and_bad_arguments(tmp_path: Path) -> None:
    rows = load_prompts(sample_dataset("formatting", 3, 2, tmp_path / "f.parquet")["path"])
    assert [r.task for r in rows] == ["formatting"] * 3
    with pytest.raises(UsageError, match="unknown task 'poetry'; known tasks: calculator, formatting"):
        sample_dataset("poetry", 4, 0, tmp_path / "x.parquet")
    for bad in (0, -3):
        with pytest.raises(UsageError, match="--rows must be a positive integer"):
            sample_dataset("calculator", bad, 0, tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_bytes_identical_in_a_fresh_process_without_torch(tmp_path: Path) -> None:
    local = sample_dataset("calculator", 8, 5, tmp_path / "here.parquet")
    code = (
        "import json, sys; from miniverl.data import sample_dataset, describe_dataset;"
        f"r = sample_dataset('calculator', 8, 5, {str(tmp_path / 'there.parquet')!r});"
        "d = describe_dataset(r['path']);"
        "import miniverl.rollout, miniverl.rewards;"
        "print(json.dumps([r['sha256'], d['sha256'], 'torch' in sys.modules]))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout) == [local["sha256"], local["sha256"], False]


def test_missing_file(tmp_path: Path) -> None:
    for call in (load_prompts, describe_dataset):
        with pytest.raises(DataError, match=r"dataset not found: .*nope\.parquet \(create one with"):
            call(tmp_path / "nope.parquet")
    with pytest.raises(DataError, match="is not a file"):
        load_prompts(tmp_path)


def test_not_parquet(tmp_path: Path) -> None:
    bad = tmp_path / "prompts.parquet"
    bad.write_text("prompt_id,prompt\na,b\n")
    for call in (load_prompts, describe_dataset):
        with pytest.raises(DataError, match="is not a readable Parquet file") as info:
            call(bad)
        assert "\n" not in str(info.value)


def test_wrong_columns(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "w.parquet", {"prompt_id": ["a"], "question": ["q"], "task": ["t"]})
    expected = r"no 'prompt' column; its columns: prompt_id, question, task \(name the prompt column with data.columns"
    for call in (load_prompts, describe_dataset):
        with pytest.raises(DataError, match=expected):
            call(path)
    repeated = pa.table([pa.array(["x"])] * 6, names=[*COLUMNS, "prompt"])
    pq.write_table(repeated, tmp_path / "r.parquet")
    with pytest.raises(DataError, match="repeated columns prompt; every column name must be unique"):
        describe_dataset(tmp_path / "r.parquet")
    columns = {name: ["x"] for name in COLUMNS}
    columns["answer"] = [3]  # type: ignore[list-item]
    typed = _write_raw(tmp_path / "t.parquet", columns)
    for call in (load_prompts, describe_dataset):
        with pytest.raises(DataError, match="column 'answer' has type int64; expected string"):
            call(typed)


def test_empty_dataset(tmp_path: Path) -> None:
    schema = pa.schema([(name, pa.string()) for name in COLUMNS])
    path = _write_raw(tmp_path / "e.parquet", {name: [] for name in COLUMNS}, schema)
    for call in (load_prompts, describe_dataset):
        with pytest.raises(DataError, match="the dataset is empty"):
            call(path)
    with pytest.raises(DataError, match="the dataset is empty"):
        write_prompts(tmp_path / "none.parquet", [])
    assert not (tmp_path / "none.parquet").exists()


def test_duplicate_prompt_id(tmp_path: Path) -> None:
    rows = [_row(0), _row(1), _row(2, prompt_id="p0"), _row(3, prompt_id="p1")]
    path = _write_raw(tmp_path / "d.parquet", {name: [r[name] for r in rows] for name in COLUMNS})
    with pytest.raises(DataError, match="duplicate prompt_id 'p0', 'p1'; ids must be unique"):
        load_prompts(path)
    with pytest.raises(DataError, match="duplicate prompt_id"):
        write_prompts(tmp_path / "dup.parquet", rows)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prompt": None}, "row 1 has a null 'prompt'"),
        ({"prompt": "   "}, r"row 1 \(prompt_id 'p1'\) has an empty 'prompt'"),
        ({"prompt_id": ""}, "has an empty 'prompt_id'"),
        ({"answer": None}, "row 1 has a null 'answer'"),
    ],
)
def test_null_or_empty_fields(tmp_path: Path, change: dict[str, object], message: str) -> None:
    rows = [_row(0), _row(1, **change)]
    schema = pa.schema([(name, pa.string()) for name in COLUMNS])
    path = _write_raw(tmp_path / "n.parquet", {name: [r[name] for r in rows] for name in COLUMNS}, schema)
    with pytest.raises(DataError, match=message):
        load_prompts(path)


def test_empty_answer_and_context_are_fine(tmp_path: Path) -> None:
    digest = write_prompts(tmp_path / "ok.parquet", [_row(0, answer="", context="")])
    assert load_prompts(tmp_path / "ok.parquet")[0].answer == ""
    assert digest == sha256_file(tmp_path / "ok.parquet")
    # column order and large_string in a foreign file are accepted
    schema = pa.schema([(name, pa.large_string()) for name in reversed(COLUMNS)])
    path = _write_raw(tmp_path / "rev.parquet", {name: [_row(5)[name]] for name in reversed(COLUMNS)}, schema)
    assert load_prompts(path) == [PromptRow(**_row(5))]  # type: ignore[arg-type]
