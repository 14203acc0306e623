"""Class: the SQL verifier. A score is a pure function of (database script, response, limits): no clock, no load,
no random source; memory, disk and time are bounded by deterministic budgets; extraction is linear; and
``valid_sql_credit`` cannot be farmed from the catalog, EXPLAIN or PRAGMA."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from miniverl.errors import DataError
from miniverl.rewards.sql import (
    ANSWER_FORMAT,
    MAX_RESPONSE_CHARS,
    SandboxRefusal,
    build_database,
    execute_sandboxed,
    extract_sql,
    fenced_blocks,
    run_query,
    sql_result_match,
)

SCRIPT = (
    "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, day TEXT);"
    "INSERT INTO t VALUES (1, 'a', '2024-01-31'), (2, 'b', '2024-02-29'), (3, 'c', '2024-03-01');"
)
ORACLE = "SELECT name FROM t WHERE day < '2024-03-01' ORDER BY id"
ANSWER = json.dumps(
    {
        "format": ANSWER_FORMAT,
        "database": SCRIPT,
        "sql": ORACLE,
        "columns": ["name"],
        "rows": [["a"], ["b"]],
        "ordered": True,
    }
)
#: a string that grows to ~8 KB by doubling (SQLite's length limit is 10 KB), then stays
BIG = "CASE WHEN length(x) < 4900 THEN x || x ELSE x END"
BOMBS = {
    "string_per_step": "WITH RECURSIVE r(n, x) AS (SELECT 1, 'a' UNION ALL SELECT n + 1, "
    "CASE WHEN length(x) < 4900 THEN x || x ELSE replace(x, 'a', 'b') END FROM r) SELECT n FROM r ORDER BY x LIMIT 1",
    "fetch_fan_out": f"WITH RECURSIVE r(n, x) AS (SELECT 1, 'a' UNION ALL SELECT n + 1, {BIG} FROM r WHERE n < 900) "
    "SELECT " + ", ".join(["x"] * 60) + " FROM r",
    "sort_of_a_cross_join": f"WITH RECURSIVE r(n, x) AS (SELECT 1, 'a' UNION ALL SELECT n + 1, {BIG} FROM r "
    "WHERE n < 3000) SELECT a.x, b.n FROM r a, r b ORDER BY a.x || b.n DESC LIMIT 1",
    "group_concat": f"WITH RECURSIVE r(n, x) AS (SELECT 1, 'a' UNION ALL SELECT n + 1, {BIG} FROM r) "
    "SELECT length(group_concat(x)) FROM r",
    "too_many_columns": "SELECT " + ", ".join(["1"] * 200),
    # a full sort (no LIMIT) of ~8 KB rows: its memory is stopped by the SQLite heap limit, not by the step budget
    "sort_in_memory": f"WITH RECURSIVE r(n, x) AS (SELECT 1, 'a' UNION ALL SELECT n + 1, {BIG} FROM r) "
    "SELECT n FROM r ORDER BY x || n",
}


def _score(response: str, credit: float = 0.0) -> float:
    return sql_result_match("p", response, answer=ANSWER, valid_sql_credit=credit, prompt_id="x")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT date('now')",
        "SELECT julianday(upper('now'))",
        "SELECT unixepoch(' NOW ')",
        "SELECT date()",
        "SELECT strftime('%s')",
        "SELECT strftime('%s', 'now')",
        "SELECT datetime('2024-01-01', 'localtime')",
        "SELECT datetime('2024-01-01', 'utc')",
        "SELECT time(x) FROM (SELECT 'now' AS x)",
        "SELECT datetime('now' || char(0) || 'x')",
        "SELECT date('2024-01-01', 'localtime' || char(0))",
        "SELECT date(CAST('now' AS BLOB))",
        "SELECT CURRENT_TIMESTAMP",
        "SELECT current_date",
        "SELECT current_time",
        "SELECT random()",
        "SELECT randomblob(4)",
        "SELECT changes()",
        "SELECT total_changes()",
        "SELECT last_insert_rowid()",
        "SELECT sqlite_version()",
    ],
)
def test_time_and_random_sources_are_refused(sql: str) -> None:
    with pytest.raises(SandboxRefusal):
        execute_sandboxed(SCRIPT, sql)
    assert _score(f"```sql\n{sql}\n```", credit=0.5) == 0.0


def test_fixed_dates_still_compute() -> None:
    assert execute_sandboxed(SCRIPT, "SELECT date('2024-02-28', '+1 day'), strftime('%Y', day) FROM t").rows[0] == (
        "2024-02-29",
        "2024",
    )


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM sqlite_master",
        "SELECT name FROM sqlite_schema WHERE type = 'table'",
        "EXPLAIN SELECT * FROM t",
        "/* hi */ -- there\n explain query plan SELECT * FROM t",
        "PRAGMA table_info(t)",
        "SELECT * FROM pragma_table_info('t')",
        "SELECT 1",
        "SELECT 'z' UNION SELECT 'y'",
    ],
)
def test_valid_sql_credit_is_not_farmable(sql: str) -> None:
    assert _score(sql, credit=0.1) == 0.0


def test_valid_sql_credit_needs_a_read_of_the_task_tables() -> None:
    assert _score("SELECT name FROM t", credit=0.1) == 0.1
    assert _score(ORACLE, credit=0.1) == 1.0


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_bombs_score_zero_quickly(name: str) -> None:
    start = time.process_time()
    with pytest.raises(SandboxRefusal):
        execute_sandboxed(SCRIPT, BOMBS[name])
    assert time.process_time() - start < 5.0  # measured 0.9 s at most on the CI machine


def test_bombs_stay_within_memory_and_write_no_temp_files(tmp_path: Path) -> None:
    """In a fresh process (so the peak is the bombs'), with SQLite's temp directory pointed at ``tmp_path``."""
    code = (
        "import json, sys\n"
        "from miniverl.rewards.sql import SandboxRefusal, execute_sandboxed\n"
        "def kib(key):\n"
        "    with open('/proc/self/status') as status:\n"
        "        return next(int(line.split()[1]) for line in status if line.startswith(key))\n"
        "with open('/proc/self/clear_refs', 'w') as refs:\n"
        "    refs.write('5')\n"  # the peak RSS (VmHWM) restarts from the current RSS
        "before = kib('VmRSS:')\n"
        "for sql in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        execute_sandboxed(sys.argv[2], sql)\n"
        "    except SandboxRefusal:\n"
        "        pass\n"
        "print(kib('VmHWM:') - before)\n"
    )
    env = {**os.environ, "SQLITE_TMPDIR": str(tmp_path), "TMPDIR": str(tmp_path), "PYTHONPATH": os.getcwd()}
    seen: set[str] = set()
    done = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(list(BOMBS.values())), SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )

    def watch() -> None:  # an open temp file of SQLite is unlinked at once: look at the child's descriptors
        fds = Path(f"/proc/{done.pid}/fd")
        while done.poll() is None:
            with contextlib.suppress(OSError):
                seen.update(os.readlink(fd) for fd in fds.iterdir())
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    out, _ = done.communicate(timeout=120)
    watcher.join()
    assert done.returncode == 0
    grown_kib = int(out.strip())
    assert grown_kib < 250 * 1024, f"{grown_kib} KiB"  # ~130 MB (the heap limit); 420-630 MB without it
    assert not [p for p in seen if p.startswith(str(tmp_path))]
    assert list(tmp_path.iterdir()) == []


def test_database_scripts_get_the_same_budgets() -> None:
    rows = (
        "CREATE TABLE u (n); "
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) INSERT INTO u SELECT n FROM r;"
    )
    big = (
        "CREATE TABLE u (x); WITH RECURSIVE r(n, x) AS (SELECT 1, 'a' UNION ALL SELECT n + 1, "
        f"{BIG} FROM r WHERE n < 100000) INSERT INTO u SELECT x FROM r;"
    )
    for script in (rows, big, "CREATE TABLE u (x); INSERT INTO u VALUES (date('now'));"):
        start = time.process_time()
        with pytest.raises(DataError, match="does not build a database within the sandbox's limits"):
            build_database(script)
        assert time.process_time() - start < 5.0


def _responses() -> list[str]:
    near = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < {}) SELECT name FROM t, r "
    responses = [ORACLE, "SELECT name FROM t", "nonsense", "SELECT date('now')", BOMBS["too_many_columns"]]
    for k in range(10):  # around the step budget (between 100,000 and 110,000): some finish, some run out
        responses.append(near.format(95_000 + 2_000 * k) + "WHERE n = 1 AND id < 3 ORDER BY id")
    for k in range(50 - len(responses)):
        responses.append(f"```sql\nSELECT name FROM t WHERE id < {k % 5} ORDER BY id\n```")
    return responses


def _scores(responses: list[str]) -> list[float]:
    return [_score(r, credit=0.1) for r in responses]


def test_scores_do_not_depend_on_the_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine so loaded that a minute passes between two looks at the clock: the scores stay the same."""
    responses = _responses()
    idle = _scores(responses)
    ticks = iter(range(10**9))
    for name in ("monotonic", "time", "perf_counter", "process_time"):
        monkeypatch.setattr(time, name, lambda: 60.0 * next(ticks))
    assert _scores(responses) == idle


def test_scores_are_identical_idle_and_under_load() -> None:
    responses = _responses()
    assert len(responses) == 50
    idle = _scores(responses)
    busy = [
        subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 60\nwhile time.time() < end: pass"])
        for _ in range(3)
    ]
    try:
        loaded = _scores(responses)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert loaded == idle
    assert {1.0, 0.1, 0.0} <= set(idle)  # the budget decides some of them


def test_extraction_is_linear_and_the_response_length_is_capped() -> None:
    for unit in ("`", "```", "```sql\n"):
        text = unit * (10_000_000 // len(unit))
        start = time.perf_counter()
        fenced_blocks(text)
        assert time.perf_counter() - start < 5.0, unit  # measured < 0.8 s; the old regex took 5.7 s at 100 KB
    hundred_kb = "```" * 33_000
    start = time.perf_counter()
    assert extract_sql(hundred_kb) == hundred_kb
    assert time.perf_counter() - start < 0.5
    assert extract_sql("```sql\nSELECT 1\n" + " " * MAX_RESPONSE_CHARS) == ""


def test_the_query_connection_refuses_after_a_refusal_and_keeps_its_data() -> None:
    connection = build_database(SCRIPT)
    try:
        with pytest.raises(SandboxRefusal):
            run_query(connection, "SELECT date('now')")
        assert run_query(connection, "SELECT count(*) FROM t").rows == ((3,),)
    finally:
        connection.close()
