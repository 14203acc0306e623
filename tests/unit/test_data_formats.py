"""Prompt datasets in the formats people have: JSON Lines and CSV beside Parquet, data.columns, derived ids."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from miniverl.data import COLUMNS, PromptRow, describe_dataset, load_prompts, sample_dataset
from miniverl.data.prompts import DEFAULT_TASK, derive_ids
from miniverl.errors import DataError
from tests.conftest import tiny_config

MAPPING = {"prompt": "question", "answer": "solution"}


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _peer_rows() -> list[dict[str, object]]:
    return [
        {"question": "What is 2 + 3?", "solution": "5", "source": "gsm-like"},
        {"question": "What is 7 - 4?", "solution": "3", "source": "gsm-like"},
    ]


def test_jsonl_with_a_mapping_derives_ids_and_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _jsonl(tmp_path / "peer.jsonl", _peer_rows())
    rows = load_prompts(path, MAPPING)
    assert [(r.prompt, r.answer, r.context, r.task) for r in rows] == [
        ("What is 2 + 3?", "5", "", DEFAULT_TASK),
        ("What is 7 - 4?", "3", "", DEFAULT_TASK),
    ]
    assert [r.prompt_id for r in rows] == derive_ids(["What is 2 + 3?", "What is 7 - 4?"])
    described = describe_dataset(path, MAPPING)
    assert described["rows"] == 2 and described["columns"] == ["question", "solution", "source"]
    err = capsys.readouterr().err
    assert err.count("notice:") == 1, err  # one notice, however often the file is read
    assert "ignoring column(s) source" in err and "error" not in err


def test_derived_ids_follow_the_prompt_not_the_row(tmp_path: Path) -> None:
    ids = derive_ids(["a", "b", "a", "a"])
    assert ids[2] == f"{ids[0]}-2" and ids[3] == f"{ids[0]}-3" and len(set(ids)) == 4
    assert len(ids[0]) == 16 and derive_ids(["b"]) == [ids[1]]  # reordering keeps an id
    path = _jsonl(tmp_path / "dup.jsonl", [{"prompt": "same"}, {"prompt": "same"}])
    assert [r.prompt_id for r in load_prompts(path)] == derive_ids(["same", "same"])


def test_csv_quotes_commas_and_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "peer.csv"
    text = 'question,solution\r\n"What is 1, plus 1?",2\r\n\r\n"Say ""hi""\nplease",hi\r\n'
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    rows = load_prompts(path, MAPPING)
    assert [(r.prompt, r.answer) for r in rows] == [("What is 1, plus 1?", "2"), ('Say "hi"\nplease', "hi")]
    assert describe_dataset(path, MAPPING)["rows"] == 2


def test_canonical_jsonl_and_csv_read_as_the_parquet_does(tmp_path: Path) -> None:
    sample_dataset("calculator", 5, 0, tmp_path / "p.parquet")
    expected = load_prompts(tmp_path / "p.parquet")
    _jsonl(tmp_path / "p.jsonl", [r.to_dict() for r in expected])
    import csv

    with (tmp_path / "p.CSV").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(reversed(COLUMNS)))
        writer.writeheader()
        writer.writerows(r.to_dict() for r in expected)
    assert load_prompts(tmp_path / "p.jsonl") == expected
    assert load_prompts(tmp_path / "p.CSV") == expected


def test_parquet_with_a_mapping_reads_only_what_it_needs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa

    table = pa.table({"q": ["x?"], "blob": [b"\x00binary"], "n": [3]})  # ignored columns of any type
    pq.write_table(table, tmp_path / "m.parquet")
    assert load_prompts(tmp_path / "m.parquet", {"prompt": "q"}) == [
        PromptRow(prompt_id=derive_ids(["x?"])[0], prompt="x?", answer="", context="", task=DEFAULT_TASK)
    ]
    assert "ignoring column(s) blob, n" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "columns", "message"),
    [
        ("p.txt", "prompt\nx\n", None, r"unknown dataset format '\.txt'; give a \.parquet, \.jsonl, \.csv file"),
        ("p.jsonl", '{"prompt": "a"}\n{"prompt": \n', None, r"line 2: malformed JSON"),
        ("p.jsonl", '["a"]\n', None, "line 1 is a JSON array; each line must be an object"),
        ("p.jsonl", '{"prompt": "a"}\n{"prompt": "b", "prompt": "c"}\n', None, "line 2: duplicate key 'prompt'"),
        ("p.jsonl", '{"prompt": "a", "answer": 5}\n', None, "'answer' is int, expected a string"),
        ("p.jsonl", '{"question": "a", "solution": "1"}\n{"question": "b"}\n', MAPPING, "line 2 has no 'solution'"),
        ("p.jsonl", '{"prompt": "a"}\n', {"answer": "solution"}, "maps answer to 'solution', which is not a column"),
        ("p.jsonl", "\n\n", None, "no 'prompt' column"),
        ("p.jsonl", b"\xff\xfe{}", None, "not UTF-8 text"),
        ("p.csv", "", None, "no header row"),
        ("p.csv", "prompt,answer\na,1,extra\n", None, "line 2 has 3 fields, the header has 2"),
        ("p.csv", "prompt,prompt\na,b\n", None, "repeated columns prompt"),
        ("p.csv", 'prompt\n"unterminated\n', None, "line 2: unexpected end of data"),
        ("p.csv", "prompt,answer\n", None, "the dataset is empty"),
        ("p.csv", "prompt\n  \n", None, "has an empty 'prompt'"),
    ],
)
def test_bad_files_fail_with_one_line(
    tmp_path: Path, name: str, content: str | bytes, columns: dict[str, str] | None, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    for call in (load_prompts, describe_dataset):
        with pytest.raises(DataError, match=message) as info:
            call(path, columns)
        assert "\n" not in str(info.value)


def test_the_config_validates_the_mapping() -> None:
    from miniverl.config.loader import validate_config
    from miniverl.errors import ConfigError

    config = tiny_config(Path("model"), data={"path": "p.jsonl", "columns": MAPPING})
    assert validate_config(config, origin="t").data.columns == MAPPING
    for bad in ({"question": "prompt"}, {"prompt": ""}):
        with pytest.raises(ConfigError, match=r"data\.columns"):
            validate_config(tiny_config(Path("model"), data={"path": "p.jsonl", "columns": bad}), origin="t")
