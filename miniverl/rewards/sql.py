"""The ``sql_result_match`` verifier and the read-only SQLite sandbox it runs responses in.

A response is SQL (the last fenced ```sql block, else the last fenced block, else the whole text; found in one
linear pass over at most :data:`MAX_RESPONSE_CHARS` characters). It runs against a fresh in-memory database built
from the row's ``answer`` (its ``database`` script) and scores 1.0 when its result set equals the oracle's, else
0.0 (or ``valid_sql_credit`` when it ran, read one of the task's own tables and returned something else).

The score is a pure function of (database script, response, limits): nothing reads the clock, the load or a
random source. The sandbox is built per call and guarded in layers:

* an authorizer that allows only reads (SELECT, column reads, recursive CTEs and an allowlist of
  deterministic built-in functions) and denies everything else: ATTACH, PRAGMA, every write,
  ``load_extension``, ``random``, ``randomblob``, ``zeroblob``, ``changes``, ``last_insert_rowid``,
  ``CURRENT_TIME``/``CURRENT_DATE``/``CURRENT_TIMESTAMP``;
* the date and time functions are replaced by wrappers that refuse ``'now'``, a missing time value (which means
  now) and the ``localtime``/``utc`` modifiers (the machine's time zone), then compute the value with SQLite's own
  function on a private connection;
* ``PRAGMA query_only`` on top of it, set before the authorizer goes in;
* memory: per-connection limits (one string, blob or row at most ``max_value_bytes``; at most ``max_columns``
  columns; the statement's length; no attached databases), ``max_page_count`` on the database, temp storage in
  memory (a sort never spills to a file), a process-wide SQLite heap limit (:data:`HEAP_LIMIT_BYTES`), and a
  budget of rows × bytes on what is fetched;
* time: a progress handler that counts virtual-machine steps and nothing else. A value is at most
  ``max_value_bytes``, so one step costs a bounded amount, and the step budget bounds the time of a query;
* one statement only, and never ``EXPLAIN``.

Anything the sandbox stops, and any SQL error, is a response that scored 0, never an exception.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from miniverl.errors import DataError, UsageError
from miniverl.rewards.registry import register_reward

ANSWER_FORMAT = "miniverl-sql-answer/v1"

#: Deterministic built-ins a query may call. Anything else (load_extension, randomblob, zeroblob,
#: random, changes, last_insert_rowid, printf/format (whose width argument builds a huge string in one VM step),
#: the CURRENT_* keywords, ...) is denied. The date and time functions are wrapped (:data:`TIME_FUNCTIONS`).
ALLOWED_FUNCTIONS = frozenset(
    {
        "abs", "avg", "cast", "char", "coalesce", "concat", "concat_ws", "count", "cume_dist", "date",
        "datetime", "dense_rank", "first_value", "glob", "group_concat", "hex", "ifnull", "iif",
        "instr", "julianday", "lag", "last_value", "lead", "length", "like", "likely", "lower", "ltrim",
        "max", "min", "nth_value", "ntile", "nullif", "percent_rank", "quote", "rank", "replace",
        "round", "row_number", "rtrim", "sign", "strftime", "string_agg", "substr", "substring", "sum",
        "time", "total", "trim", "typeof", "unicode", "unixepoch", "unlikely", "upper",
    }
)  # fmt: skip

#: date/time functions → the index of their time-value argument (``strftime``'s first argument is the format)
TIME_FUNCTIONS = {"date": 0, "time": 0, "datetime": 0, "julianday": 0, "unixepoch": 0, "strftime": 1}
#: argument values that make a date/time function depend on when or where it runs
NON_DETERMINISTIC_TIME_ARGS = frozenset({"now", "localtime", "utc"})
#: names that read the clock or the connection's history: refused even if the authorizer were bypassed
REFUSED_FUNCTIONS = ("current_time", "current_date", "current_timestamp", "random", "randomblob", "changes")

#: SQLite's heap (all connections of the process) may not pass this: a query that needs more fails (score 0).
HEAP_LIMIT_BYTES = 128 << 20
#: The longest response searched for SQL; a longer one scores 0 without being read.
MAX_RESPONSE_CHARS = 1 << 20

_QUERY_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
#: Building the row's database: tables, their rows, and SQLite's own catalog bookkeeping.
_SETUP_ACTIONS = _QUERY_ACTIONS | {sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_CREATE_INDEX}
_CATALOG = frozenset({"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"})


@dataclass(frozen=True)
class SandboxLimits:
    """What one query (or one database script) may use; every bound is deterministic.

    ``max_steps`` counts SQLite VM steps, checked every ``steps_per_check``; ``max_value_bytes`` bounds one string,
    blob or row, so it bounds the cost of one step too; ``max_result_bytes`` bounds what is fetched (rows × width).
    """

    max_statement_chars: int = 4_000
    max_rows: int = 1_000
    max_value_bytes: int = 10_000
    max_columns: int = 64
    max_result_bytes: int = 1 << 20
    max_steps: int = 2_000_000
    steps_per_check: int = 1_000
    max_database_chars: int = 200_000
    max_database_pages: int = 4_096  # 16 MiB at SQLite's default 4 KiB pages


DEFAULT_LIMITS = SandboxLimits()


class SandboxRefusal(Exception):
    """The query did not produce a result: a SQL error, a denied action, or a limit reached."""


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    #: whether the statement read one of the tables the row's database script created (not only the catalog)
    reads_task_tables: bool = False


class _Reads:
    """The tables a statement read, as the authorizer reported them while it was prepared."""

    def __init__(self) -> None:
        self.tables: set[str] = set()


class SandboxConnection(sqlite3.Connection):
    """A sandbox's connection: it knows the tables its database script created and what a statement read."""

    task_tables: frozenset[str] = frozenset()
    reads: _Reads | None = None
    clock: sqlite3.Connection | None = None  # computes the wrapped date/time functions

    def close(self) -> None:
        if self.clock is not None:
            self.clock.close()
        super().close()


def _authorizer(allowed_actions: frozenset[int], reads: _Reads | None = None) -> Any:
    def authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
        if action == sqlite3.SQLITE_FUNCTION:
            return sqlite3.SQLITE_OK if (arg2 or "").lower() in ALLOWED_FUNCTIONS else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_UPDATE and allowed_actions is not _QUERY_ACTIONS:
            return sqlite3.SQLITE_OK if arg1 in _CATALOG else sqlite3.SQLITE_DENY  # CREATE TABLE's bookkeeping
        if action == sqlite3.SQLITE_READ and reads is not None and arg1 is not None:
            reads.tables.add(arg1.lower())
        return sqlite3.SQLITE_OK if action in allowed_actions else sqlite3.SQLITE_DENY

    return authorize


class _Budget:
    """The progress handler: stop after ``max_steps`` VM steps. No clock: the same query always ends alike."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.checks_left = max(1, limits.max_steps // limits.steps_per_check)
        self.reason = ""

    def __call__(self) -> int:
        self.checks_left -= 1
        if self.checks_left < 0:
            self.reason = "step budget exhausted"
            return 1
        return 0


class NonDeterministicCall(Exception):
    """A date/time function asked for the current time or the machine's time zone."""


def _time_function(name: str, clock: sqlite3.Connection) -> Callable[..., Any]:
    position = TIME_FUNCTIONS[name]

    def call(*args: Any) -> Any:
        if len(args) <= position:  # no time value means 'now'
            raise NonDeterministicCall(f"{name}() without a time value reads the clock")
        for value in args[position:]:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            # SQLite reads the text up to a NUL, case-insensitively: 'NOW\x00x' is 'now' to it
            if isinstance(text, str) and text.split("\x00", 1)[0].strip().lower() in NON_DETERMINISTIC_TIME_ARGS:
                raise NonDeterministicCall(f"{name}({text!r}) depends on when or where it runs")
        marks = ", ".join("?" * len(args))
        return clock.execute(f"SELECT {name}({marks})", args).fetchone()[0]

    return call


def _refused(name: str) -> Callable[..., Any]:
    def call(*_args: Any) -> Any:
        raise NonDeterministicCall(f"{name}() is not deterministic")

    return call


_heap_limited = False


def _limit_heap() -> None:
    """Set SQLite's process-wide soft and hard heap limits once (the hard one can only ever be lowered)."""
    global _heap_limited
    if _heap_limited:
        return
    with sqlite3.connect(":memory:") as probe:
        probe.execute(f"PRAGMA hard_heap_limit = {HEAP_LIMIT_BYTES}")
        probe.execute(f"PRAGMA soft_heap_limit = {HEAP_LIMIT_BYTES // 2}")
    probe.close()
    _heap_limited = True


def _connect(limits: SandboxLimits) -> SandboxConnection:
    _limit_heap()
    connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=True, factory=SandboxConnection)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    connection.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, limits.max_columns)
    connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000)
    connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(limits.max_statement_chars, limits.max_database_chars))
    connection.execute("PRAGMA temp_store = MEMORY")  # a sort or a temp table never spills to a file
    connection.execute(f"PRAGMA max_page_count = {limits.max_database_pages}")
    connection.execute("PRAGMA cache_size = -2048")  # KiB
    clock = connection.clock = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=True)
    for name in TIME_FUNCTIONS:
        connection.create_function(name, -1, _time_function(name, clock), deterministic=True)
    for name in REFUSED_FUNCTIONS:
        connection.create_function(name, -1, _refused(name))
    return connection


def build_database(script: str, limits: SandboxLimits = DEFAULT_LIMITS) -> SandboxConnection:
    """A fresh in-memory database from ``script`` (CREATE TABLE / CREATE INDEX / INSERT only), read-only after.

    The script runs under the same budgets as a query (steps, value size, pages, heap). A script that does anything
    else, or passes a budget, is a :class:`DataError` (the dataset is broken, not the response).
    """
    if len(script) > limits.max_database_chars:
        raise DataError(
            f"sql answer: the database script has {len(script)} characters (limit {limits.max_database_chars})"
        )
    connection = _connect(limits)
    budget = _Budget(limits)
    try:
        connection.set_authorizer(_authorizer(_SETUP_ACTIONS))
        connection.set_progress_handler(budget, limits.steps_per_check)
        connection.executescript(script)
        connection.set_progress_handler(None, 0)
        connection.set_authorizer(None)
        tables = frozenset(
            str(name).lower()
            for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if not str(name).lower().startswith("sqlite_")
        )
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_statement_chars)
    except (sqlite3.Error, MemoryError, OverflowError, ValueError) as exc:
        connection.close()
        why = budget.reason or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise DataError(
            f"sql answer: the database script does not build a database within the sandbox's limits ({why}); "
            "use only CREATE TABLE, CREATE INDEX and INSERT of small tables"
        ) from None
    connection.task_tables = tables
    connection.reads = _Reads()
    connection.set_authorizer(_authorizer(_QUERY_ACTIONS, connection.reads))
    return connection


def _skip_comments(sql: str) -> int:
    """The index of the first character of ``sql`` that is not whitespace or a comment (one linear pass)."""
    i, n = 0, len(sql)
    while i < n:
        if sql[i].isspace():
            i += 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            break
    return i


def _value_bytes(value: Any) -> int:
    if isinstance(value, str | bytes):
        return len(value) + 8
    return 8


def run_query(connection: sqlite3.Connection, sql: str, limits: SandboxLimits = DEFAULT_LIMITS) -> QueryResult:
    """Run one read-only statement under the limits; :class:`SandboxRefusal` says why it gave no result."""
    text = sql.strip()
    if not text:
        raise SandboxRefusal("empty statement")
    if len(text) > limits.max_statement_chars:
        raise SandboxRefusal(f"statement longer than {limits.max_statement_chars} characters")
    start = _skip_comments(text)
    if text[start : start + 7].lower() == "explain":
        raise SandboxRefusal("EXPLAIN is not a query")
    reads = getattr(connection, "reads", None)
    if reads is not None:
        reads.tables.clear()
    budget = _Budget(limits)
    connection.set_progress_handler(budget, limits.steps_per_check)
    rows: list[tuple[Any, ...]] = []
    size = 0
    try:
        cursor = connection.execute(text)
        columns = tuple(d[0] for d in cursor.description or ())
        while len(rows) <= limits.max_rows and size <= limits.max_result_bytes:
            row = cursor.fetchone()
            if row is None:
                break
            rows.append(tuple(row))
            size += sum(_value_bytes(v) for v in row) + 16
        cursor.close()
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as exc:
        raise SandboxRefusal(budget.reason or f"{type(exc).__name__}: {exc}") from None
    finally:
        connection.set_progress_handler(None, 0)
    if not columns:
        raise SandboxRefusal("the statement returns no result set")
    if len(rows) > limits.max_rows:
        raise SandboxRefusal(f"more than {limits.max_rows} rows")
    if size > limits.max_result_bytes:
        raise SandboxRefusal(f"a result larger than {limits.max_result_bytes} bytes")
    tables: frozenset[str] = getattr(connection, "task_tables", frozenset())
    read_task = reads is not None and bool(reads.tables & tables)
    return QueryResult(columns=columns, rows=tuple(rows), reads_task_tables=read_task)


def execute_sandboxed(script: str, sql: str, limits: SandboxLimits = DEFAULT_LIMITS) -> QueryResult:
    """Build the database from ``script`` and run ``sql`` on it (the connection is closed after)."""
    connection = build_database(script, limits)
    try:
        return run_query(connection, sql, limits)
    finally:
        connection.close()


def canonical_value(value: Any) -> Any:
    """A JSON-safe value that compares equal when SQL values do: numbers as floats rounded to 6 places."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        number = float(value)
        if not math.isfinite(number):
            return repr(number)
        rounded = round(number, 6)
        return int(rounded) if rounded.is_integer() and abs(rounded) < 2**53 else rounded
    if isinstance(value, bytes):
        return {"blob": value.hex()}
    raise TypeError(f"unexpected SQL value of type {type(value).__name__}")


def canonical_rows(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    return [[canonical_value(v) for v in row] for row in rows]


def _sort_key(row: Sequence[Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"))


def results_match(expected: Sequence[Sequence[Any]], got: Sequence[Sequence[Any]], *, ordered: bool) -> bool:
    """Equal result sets: same row count and width, same canonical rows (as a multiset unless ``ordered``).

    Column names are not compared: ``SELECT COUNT(*) AS n`` and ``SELECT COUNT(*)`` answer alike.
    """
    left, right = canonical_rows(expected), canonical_rows(got)
    if len(left) != len(right):
        return False
    if not ordered:
        left, right = sorted(left, key=_sort_key), sorted(right, key=_sort_key)
    return left == right


_LANG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-")


def fenced_blocks(response: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block, in order, found in one linear pass.

    A block opens with a line starting at a triple backtick (its language is the word right after it), and runs
    to the next triple backtick or the end of the text (a block cut short by ``max_new_tokens``).
    """
    blocks: list[tuple[str, str]] = []
    pos, n = 0, len(response)
    while pos < n:
        opening = response.find("```", pos)
        if opening < 0:
            break
        line_end = response.find("\n", opening + 3)
        if line_end < 0:  # no newline after it, so none after any later fence either
            break
        header = response[opening + 3 : line_end].lstrip(" \t")
        width = 0
        while width < len(header) and header[width] in _LANG_CHARS:
            width += 1
        closing = response.find("```", line_end + 1)
        end = n if closing < 0 else closing
        blocks.append((header[:width], response[line_end + 1 : end]))
        pos = n if closing < 0 else closing + 3
    return blocks


def extract_sql(response: str) -> str:
    """The SQL of a response: the last ```sql block, else the last fenced block, else the whole text.

    Linear in the length of the response; a response longer than :data:`MAX_RESPONSE_CHARS` yields no SQL.
    """
    if len(response) > MAX_RESPONSE_CHARS:
        return ""
    blocks = fenced_blocks(response)
    sql_blocks = [body for lang, body in blocks if lang.lower() in ("sql", "sqlite")]
    if sql_blocks:
        return sql_blocks[-1].strip()
    if blocks:
        return blocks[-1][1].strip()
    return response.strip()


@dataclass(frozen=True)
class SqlAnswer:
    """The ``answer`` column of a ``sqlite_recovery`` row (canonical JSON)."""

    database: str
    sql: str
    columns: tuple[str, ...]
    rows: list[list[Any]]
    ordered: bool

    def to_json(self) -> str:
        payload = {
            "format": ANSWER_FORMAT,
            "database": self.database,
            "sql": self.sql,
            "columns": list(self.columns),
            "rows": self.rows,
            "ordered": self.ordered,
        }
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


_ANSWER_KEYS = {"format", "database", "sql", "columns", "rows", "ordered"}


def parse_answer(answer: str, prompt_id: str = "?") -> SqlAnswer:
    """The row's answer; a :class:`DataError` names what is wrong with it."""
    try:
        payload = json.loads(answer)
    except (TypeError, ValueError):
        raise DataError(
            f"sql answer of prompt {prompt_id} is not JSON; sql_result_match needs a sqlite_recovery row"
        ) from None
    if not isinstance(payload, dict) or set(payload) != _ANSWER_KEYS or payload.get("format") != ANSWER_FORMAT:
        raise DataError(
            f"sql answer of prompt {prompt_id} is not a {ANSWER_FORMAT} object "
            f"with keys {', '.join(sorted(_ANSWER_KEYS))}"
        )
    kinds = (
        isinstance(payload["database"], str)
        and isinstance(payload["sql"], str)
        and isinstance(payload["columns"], list)
        and all(isinstance(c, str) for c in payload["columns"])
        and isinstance(payload["rows"], list)
        and all(isinstance(r, list) for r in payload["rows"])
        and isinstance(payload["ordered"], bool)
    )
    if not kinds:
        raise DataError(f"sql answer of prompt {prompt_id}: a field has the wrong type")
    return SqlAnswer(
        database=payload["database"],
        sql=payload["sql"],
        columns=tuple(payload["columns"]),
        rows=payload["rows"],
        ordered=payload["ordered"],
    )


@register_reward("sql_result_match")
def sql_result_match(prompt: str, response: str, *, answer: str, valid_sql_credit: float = 0.0, **meta: Any) -> float:
    """1.0 when the response's SQL returns the oracle's result set on the row's database, else 0.0.

    The SQL is the last ```sql block of the response (else the last fenced block, else the whole
    text). It runs read-only in a fresh in-memory SQLite sandbox (allowlisted functions, a step
    budget, row/length/memory limits, one statement). Rows compare as a multiset unless the question asks
    for an order; column names are ignored, numbers compare rounded to 6 places. A query that runs, reads one
    of the task's own tables (not only the catalog) but returns another result scores ``valid_sql_credit``
    (default 0); an error, a refusal by the sandbox, EXPLAIN, or a query of the catalog alone scores 0.
    """
    if not 0.0 <= valid_sql_credit < 1.0:
        raise UsageError(f"sql_result_match: valid_sql_credit must be in [0, 1), got {valid_sql_credit}")
    expected = parse_answer(answer, str(meta.get("prompt_id", "?")))
    connection = build_database(expected.database)
    try:
        got = run_query(connection, extract_sql(response))
    except SandboxRefusal:
        return 0.0
    finally:
        connection.close()
    if results_match(expected.rows, got.rows, ordered=expected.ordered):
        return 1.0
    return valid_sql_credit if got.reads_task_tables else 0.0
