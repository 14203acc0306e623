"""The sqlite_recovery task: deterministic rows, the sql_result_match verifier and its sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from miniverl.canonical import sha256_file
from miniverl.data import load_prompts, sample_dataset
from miniverl.data.sqlite_recovery import (
    LEVELS,
    ORACLE_TRAJECTORIES_SHA256,
    generate_sqlite_recovery,
    mistake_response,
    oracle_response,
    oracle_trajectories,
    oracle_trajectories_digest,
)
from miniverl.errors import DataError, UsageError
from miniverl.rewards import CompositeReward, get_reward
from miniverl.rewards.sql import (
    SandboxLimits,
    SandboxRefusal,
    build_database,
    execute_sandboxed,
    extract_sql,
    results_match,
    run_query,
    sql_result_match,
)

REPO = Path(__file__).resolve().parents[2]
ROWS = generate_sqlite_recovery(50, 3)


def _score(row: dict[str, str], response: str, **params: float) -> float:
    return sql_result_match(row["prompt"], response, answer=row["answer"], prompt_id=row["prompt_id"], **params)


def test_sample_is_deterministic_by_seed(tmp_path: Path) -> None:
    first = sample_dataset("sqlite_recovery", 24, 5, tmp_path / "a.parquet")
    again = sample_dataset("sqlite_recovery", 24, 5, tmp_path / "b.parquet")
    other = sample_dataset("sqlite_recovery", 24, 6, tmp_path / "c.parquet")
    assert first["sha256"] == again["sha256"] == sha256_file(tmp_path / "b.parquet")
    assert other["sha256"] != first["sha256"]
    rows = load_prompts(tmp_path / "a.parquet")
    assert [r.to_dict() for r in rows] == generate_sqlite_recovery(24, 5)
    assert generate_sqlite_recovery(30, 5)[:24] == generate_sqlite_recovery(24, 5)  # row i depends on (seed, i) only
    assert all(r.task == "sqlite_recovery" and r.prompt_id.startswith("sql-5-") for r in rows)


def test_sample_from_the_cli_in_a_fresh_process_gives_the_same_bytes(tmp_path: Path) -> None:
    out = tmp_path / "cli.parquet"
    command = [sys.executable, "-m", "miniverl", "data", "sample", "--task", "sqlite_recovery", "--rows", "12"]
    done = subprocess.run(
        [*command, "--seed", "5", "--out", str(out), "--json"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert (
        json.loads(done.stdout)["sha256"]
        == sample_dataset("sqlite_recovery", 12, 5, tmp_path / "here.parquet")["sha256"]
    )


def test_rows_hold_database_question_attempt_and_outcome() -> None:
    kinds = set()
    for row in ROWS:
        prompt = row["prompt"]
        assert "CREATE TABLE" in prompt and "INSERT INTO" in prompt and "Question: " in prompt
        assert "First attempt:\n```sql\n" in prompt
        assert "It failed with: " in prompt or ", which is wrong." in prompt
        answer = json.loads(row["answer"])
        assert answer["format"] == "miniverl-sql-answer/v1" and answer["rows"] and answer["database"] in prompt
        assert answer["sql"] in row["context"] and answer["sql"] not in prompt
        kinds.add("error" if "It failed with: " in prompt else "wrong_result")
        # the recorded result is what the oracle returns
        assert results_match(answer["rows"], execute_sandboxed(answer["database"], answer["sql"]).rows, ordered=True)
    assert kinds == {"error", "wrong_result"}


def test_every_level_occurs_and_the_context_is_a_complete_oracle_response() -> None:
    from miniverl.data.sqlite_recovery import _leveled_row

    assert {_leveled_row(3, i)[1] for i in range(len(ROWS))} == set(LEVELS)
    for row in ROWS:
        assert row["context"].startswith("The first attempt ")
        assert _score(row, row["context"]) == 1.0  # usable as an SFT target (algorithm.offline.target_column)


def test_difficulty_levels_spread_the_lengths() -> None:
    lengths = sorted(len(r["prompt"]) for r in generate_sqlite_recovery(100, 0))
    assert lengths[-1] >= 2.5 * lengths[0]


def test_oracle_scores_one_and_the_failed_attempt_zero_on_every_row() -> None:
    for row in ROWS:
        oracle = oracle_response(json.loads(row["answer"])["sql"])
        assert _score(row, oracle) == 1.0, row["prompt_id"]
        assert _score(row, mistake_response(row)) == 0.0, row["prompt_id"]
        assert _score(row, mistake_response(row), valid_sql_credit=0.25) in (0.0, 0.25)
        assert _score(row, "I am not sure.") == 0.0


def test_partial_credit_for_valid_sql_that_answers_something_else() -> None:
    row = ROWS[0]
    table = json.loads(row["answer"])["database"].split("CREATE TABLE ", 1)[1].split(" ", 1)[0].strip("(")
    assert _score(row, f"SELECT 1 FROM {table} WHERE 0 = 1", valid_sql_credit=0.1) == 0.1
    assert _score(row, "SELECT 1 WHERE 0 = 1", valid_sql_credit=0.1) == 0.0  # reads none of the task's tables
    assert _score(row, "SELEC nonsense", valid_sql_credit=0.1) == 0.0
    with pytest.raises(UsageError, match="valid_sql_credit"):
        _score(row, "SELECT 1", valid_sql_credit=1.5)


def test_rows_compare_order_insensitive_unless_ordered() -> None:
    assert results_match([[1, "a"], [2, "b"]], [[2, "b"], [1, "a"]], ordered=False)
    assert not results_match([[1, "a"], [2, "b"]], [[2, "b"], [1, "a"]], ordered=True)
    assert results_match([[2.5]], [[2.5000000001]], ordered=True) and results_match([[3]], [[3.0]], ordered=True)
    assert not results_match([[1]], [[1], [1]], ordered=False) and not results_match([[1]], [["1"]], ordered=False)
    for row in ROWS:
        answer = json.loads(row["answer"])
        if not answer["ordered"] and len(answer["rows"]) > 1:  # the same rows in another order still match
            assert _score(row, f"WITH o AS ({answer['sql']}) SELECT * FROM o ORDER BY 1 DESC") == 1.0
            assert _score(row, f"WITH o AS ({answer['sql']}) SELECT * FROM o LIMIT 1") == 0.0


def test_extract_sql() -> None:
    assert extract_sql("SELECT 1") == "SELECT 1"
    assert extract_sql("Fixed:\n```sql\nSELECT 2;\n```\nDone.") == "SELECT 2;"
    assert extract_sql("```sql\nSELECT 1\n```\nbetter:\n```sql\nSELECT 3\n```") == "SELECT 3"
    assert extract_sql("```\nSELECT 4\n```") == "SELECT 4"
    assert extract_sql("```SQL\nSELECT 5") == "SELECT 5"  # an unclosed block (cut by max_new_tokens)


def test_registered_with_its_param_and_usable_in_a_composite() -> None:
    assert get_reward("sql_result_match") is sql_result_match
    composite = CompositeReward([("sql_result_match", 1.0, {"valid_sql_credit": 0.2})])
    row = ROWS[1]
    meta = {"answer": row["answer"], "context": row["context"], "task": row["task"], "prompt_id": row["prompt_id"]}
    assert composite(row["prompt"], oracle_response(json.loads(row["answer"])["sql"]), **meta) == 1.0


def test_a_broken_answer_is_a_data_error() -> None:
    with pytest.raises(DataError, match="not JSON"):
        sql_result_match("p", "SELECT 1", answer="the answer is 42")
    with pytest.raises(DataError, match="miniverl-sql-answer/v1"):
        sql_result_match("p", "SELECT 1", answer=json.dumps({"sql": "SELECT 1"}))
    answer = json.loads(ROWS[0]["answer"])
    answer["database"] = "ATTACH DATABASE '/tmp/x.db' AS x; CREATE TABLE t(x);"
    with pytest.raises(DataError, match="does not build a database"):
        sql_result_match("p", "SELECT 1", answer=json.dumps(answer))


SCRIPT = (
    "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER);"
    "INSERT INTO t VALUES (1, 'a', 3), (2, 'b', 5), (3, 'c', 7);"
)
CTE = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r"
HOSTILE = {
    "recursive_cte_bomb": f"{CTE}) SELECT count(*) FROM r",
    "recursive_cte_rows": f"{CTE}) SELECT n FROM r",
    "recursive_cte_sorted": f"{CTE}) SELECT n FROM r ORDER BY n DESC LIMIT 1",
    "string_doubling": "WITH RECURSIVE r(x) AS (SELECT 'a' UNION ALL SELECT x || x FROM r) SELECT max(length(x)) "
    "FROM r",
    "huge_cross_join": f"{CTE} WHERE n < 1000) SELECT count(*) FROM r a, r b, r c, r d",
    "table_cross_join": "SELECT count(*) FROM " + ", ".join(f"t t{k}" for k in range(15)),
    "randomblob": "SELECT randomblob(1e9)",
    "randomblob_length": "SELECT length(randomblob(1000000000))",
    "zeroblob": "SELECT zeroblob(1000000000)",
    "printf_width": "SELECT printf('%.*c', 1000000000, 'x')",
    "attach": "ATTACH DATABASE ':memory:' AS other",
    "attach_file": "ATTACH DATABASE '/tmp/miniverl-sql-attack.db' AS other",
    "pragma_writable_schema": "PRAGMA writable_schema = ON",
    "pragma_query_only_off": "PRAGMA query_only = OFF",
    "pragma_read": "PRAGMA table_info(t)",
    "load_extension": "SELECT load_extension('/tmp/evil.so')",
    "multiple_statements": "SELECT 1; DROP TABLE t",
    "insert": "INSERT INTO t VALUES (4, 'd', 9)",
    "delete": "DELETE FROM t",
    "drop": "DROP TABLE t",
    "create": "CREATE TABLE u (x)",
    "vacuum_into": "VACUUM INTO '/tmp/miniverl-sql-attack.db'",
    "begin": "BEGIN IMMEDIATE",
    "random": "SELECT random()",
    "too_long": "SELECT " + " + ".join(["1"] * 3000),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_sql_scores_zero_within_the_limit(name: str) -> None:
    row = ROWS[0]
    start = time.monotonic()
    assert _score(row, f"```sql\n{HOSTILE[name]}\n```", valid_sql_credit=0.5) == 0.0
    with pytest.raises(SandboxRefusal):
        execute_sandboxed(SCRIPT, HOSTILE[name])
    assert time.monotonic() - start < 10.0  # generous: CI is a loaded 2-core machine
    assert not Path("/tmp/miniverl-sql-attack.db").exists()


def test_the_database_is_unchanged_after_hostile_statements() -> None:
    connection = build_database(SCRIPT)
    try:
        for name in ("insert", "delete", "drop", "create", "pragma_query_only_off", "multiple_statements", "attach"):
            with pytest.raises(SandboxRefusal):
                run_query(connection, HOSTILE[name])
        assert run_query(connection, "SELECT id, name, qty FROM t ORDER BY id").rows == (
            (1, "a", 3),
            (2, "b", 5),
            (3, "c", 7),
        )
    finally:
        connection.close()


def test_the_step_budget_is_deterministic_and_the_row_limit_holds() -> None:
    tight = SandboxLimits(max_steps=20_000, max_rows=5)
    with pytest.raises(SandboxRefusal, match="step budget"):
        execute_sandboxed(SCRIPT, f"{CTE}) SELECT count(*) FROM r", tight)
    assert execute_sandboxed(SCRIPT, f"{CTE} WHERE n < 5) SELECT n FROM r", tight).rows == tuple(
        (n,) for n in range(1, 6)
    )
    with pytest.raises(SandboxRefusal, match="more than 5 rows"):
        execute_sandboxed(SCRIPT, f"{CTE} WHERE n < 6) SELECT n FROM r", tight)


def test_oracle_trajectories_are_pinned() -> None:
    trajectories = oracle_trajectories()
    assert oracle_trajectories_digest(trajectories) == ORACLE_TRAJECTORIES_SHA256
    assert len(trajectories) == 8 and len({t.prompt_id for t in trajectories}) == 8
    assert sorted(t.level for t in trajectories) == [1, 1, 2, 2, 3, 3, 4, 4]
    for t in trajectories:
        assert t.prompt == t.row["prompt"]
        assert _score(t.row, t.response) == 1.0


def test_bench_pieces_cover_the_text_and_hash_into_the_vocab() -> None:
    from miniverl.bench.oracle_workload import hashed_encoder, padding_by_batch, pieces

    for t in oracle_trajectories():
        assert "".join(pieces(t.prompt)) == t.prompt
    encode = hashed_encoder(128)
    ids = encode(ROWS[0]["prompt"])
    assert ids == encode(ROWS[0]["prompt"]) and all(3 <= i < 128 for i in ids)
    assert len(ids) < len(ROWS[0]["prompt"]) / 1.5  # pieces, not characters (digits are one piece each)
    assert padding_by_batch([5, 3, 4, 1]) == {"2": 2 + 1, "4": 7, "8": 7}
