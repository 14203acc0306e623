"""Class: data files and documents. Decompression is budgeted (Parquet row groups, dictionaries), the bounded reader
grows its buffer, JSON is strict (lone surrogates refused at load), JSON Lines splits on newlines only, one
field-length limit holds for every format, and YAML aliases are bounded by their expanded size."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from miniverl import bounded
from miniverl.config.strict import StrictFormatError, loads_json, loads_yaml
from miniverl.data import load_prompts
from miniverl.errors import DataError


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_one_row_jsonl_loads_under_a_4_gb_address_limit(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": "4"}\n')
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (4_000_000_000, 4_000_000_000))\n"
        "from pathlib import Path\n"
        "from miniverl import bounded\n"
        "from miniverl.data import load_prompts\n"
        "assert len(bounded.read_bytes(Path(sys.argv[1]), limit=bounded.PARQUET_MAX_BYTES, what='x')) == 34\n"
        "print(len(load_prompts(sys.argv[1])))\n"
    )
    done = _run(code, str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def _dictionary_bomb(path: Path, rows: int, width: int) -> None:
    """``rows`` copies of one ``width``-character prompt: a dictionary page and run-length indices (a few KB)."""

    def column(value: str) -> pa.DictionaryArray:
        return pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))

    table = pa.table({"prompt": column("x" * width), "answer": column("4")})
    pq.write_table(table, path, compression="zstd", use_dictionary=True, row_group_size=rows, store_schema=False)


def test_a_parquet_dictionary_bomb_is_refused_within_the_budget(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    _dictionary_bomb(path, rows=200_000, width=4_000)  # decodes to 800 MB of strings; the footer claims 100 MB
    assert path.stat().st_size < 200_000
    code = (
        "import sys\n"
        "from miniverl.data import load_prompts\n"
        "from miniverl.errors import DataError\n"
        "try:\n"
        "    load_prompts(sys.argv[1])\n"
        "except DataError as exc:\n"
        "    print(exc)\n"
        # this process's own high-water mark (ru_maxrss would carry the test runner's peak across exec)
        "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))\n"
    )
    done = _run(code, str(path))
    message, peak_kib = done.stdout.strip().splitlines()
    assert "decode to more than the 256 MiB limit for a prompts dataset" in message
    assert int(peak_kib) < 700 * 1024, peak_kib


def test_parquet_footer_claims_and_row_counts_are_checked_before_reading(tmp_path: Path) -> None:
    rows = tmp_path / "rows.parquet"
    _dictionary_bomb(rows, rows=bounded.DATASET_MAX_ROWS + 1, width=1)
    with pytest.raises(DataError, match="500,001 rows, over the limit of 500,000"):
        load_prompts(rows)
    big = tmp_path / "big.parquet"
    many = pa.array([f"{k:020d}" for k in range(bounded.DATASET_MAX_ROWS)])
    pq.write_table(pa.table({"prompt": many, "answer": many}), big, compression="zstd", use_dictionary=False)
    with pytest.raises(DataError, match=r"decode to 2\d\d\.\d MB, over the 256 MiB limit"):
        load_prompts(big)


def test_lone_surrogates_are_refused_at_load_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"prompt_id": "a", "prompt": "x\\ud800y", "answer": "4"}\n')
    with pytest.raises(DataError, match=r"line 1: a lone surrogate \\ud800 is not a character") as caught:
        load_prompts(path)
    assert "\n" not in str(caught.value)
    assert loads_json('{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}  # a pair is one character
    for text in ('{"\\udc00": 1}', '["\\udfff"]'):
        with pytest.raises(StrictFormatError, match="lone surrogate"):
            loads_json(text)
    with pytest.raises(StrictFormatError, match="lone surrogate"):
        loads_yaml('run:\n  name: "\\uD800"\n')


def test_jsonl_lines_end_at_newlines_only(tmp_path: Path) -> None:
    path = tmp_path / "u.jsonl"
    rows = [{"prompt": "a\u2028b", "answer": "1"}, {"prompt": "c\x85d\u2029e\x0bf\x0cg", "answer": "2"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows), encoding="utf-8")
    assert [r.prompt for r in load_prompts(path)] == ["a\u2028b", "c\x85d\u2029e\x0bf\x0cg"]


def test_one_field_length_limit_for_every_format(tmp_path: Path) -> None:
    fine, too_long = "p" * 200_000, "q" * (bounded.FIELD_MAX_CHARS + 1)
    for prompt, ok in ((fine, True), (too_long, False)):
        paths = [tmp_path / f"{len(prompt)}.{kind}" for kind in ("jsonl", "csv", "parquet")]
        paths[0].write_text(json.dumps({"prompt": prompt, "answer": "4"}) + "\n")
        with open(paths[1], "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerows([["prompt", "answer"], [prompt, "4"]])
        pq.write_table(pa.table({"prompt": [prompt], "answer": ["4"]}), paths[2])
        for path in paths:
            if ok:
                assert load_prompts(path)[0].prompt == prompt
            else:
                with pytest.raises(DataError, match=r"longer than 1,000,000 characters|has 1,000,001 characters"):
                    load_prompts(path)


def test_a_billion_laughs_yaml_is_refused_at_once() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 10):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    start = time.perf_counter()
    with pytest.raises(StrictFormatError, match="expands to more than 200,000 nodes"):
        loads_yaml("\n".join(lines))
    assert time.perf_counter() - start < 1.0
    with pytest.raises(StrictFormatError, match="recursive anchor"):
        loads_yaml("&a [*a]")
    assert loads_yaml("base: &b {x: 1}\nother: {<<: *b, y: 2}") == {"base": {"x": 1}, "other": {"x": 1, "y": 2}}


def test_plan_refuses_a_prompt_longer_than_the_context_in_tokens(cli, workdir: Path, tiny_model_dir: Path) -> None:
    import yaml

    from tests.cli.test_cli_errors import assert_clean_error
    from tests.conftest import tiny_config

    rows = [{"prompt": "2 + 2 = ?", "answer": "4"}, {"prompt": "1 + 1 = " * 300, "answer": "2"}]
    (workdir / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = tiny_config(tiny_model_dir)
    config["data"]["path"] = "p.jsonl"
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    assert_clean_error(cli("plan", "c.yaml", "--out", "plan.json"), 2, "tokens; the student's context of 512 less")
    assert not (workdir / "plan.json").exists()
    rows[1]["prompt"] = "1 + 1 = " * 20  # longer in bytes than nothing, well inside in tokens
    (workdir / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli("plan", "c.yaml", "--out", "plan.json").code == 0


def test_plan_refuses_a_lone_surrogate_in_one_line(cli, workdir: Path, tiny_model_dir: Path) -> None:
    import yaml

    from tests.cli.test_cli_errors import assert_clean_error
    from tests.conftest import tiny_config

    (workdir / "p.jsonl").write_text('{"prompt_id": "a", "prompt": "2 + 2 = \\ud800?", "answer": "4"}\n')
    config = tiny_config(tiny_model_dir)
    config["data"]["path"] = "p.jsonl"
    (workdir / "c.yaml").write_text(yaml.safe_dump(config))
    assert_clean_error(cli("plan", "c.yaml", "--out", "plan.json"), 2, "line 1: a lone surrogate \\ud800")
    assert not (workdir / "plan.json").exists()


def _laughs() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 10):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_through_verl_config_and_bindings(cli, workdir: Path) -> None:
    from miniverl import bounded
    from miniverl.handoff.native import _load_bindings
    from tests.cli.test_cli_errors import assert_clean_error

    (workdir / "laughs.yaml").write_text(_laughs())
    start = time.perf_counter()
    assert_clean_error(cli("plan", "--verl-config", "laughs.yaml"), 2, "expands to more than 200,000 nodes")
    with pytest.raises(bounded.InputBoundError, match="expands to more than 200,000 nodes"):
        _load_bindings(workdir / "laughs.yaml")
    assert time.perf_counter() - start < 2.0
