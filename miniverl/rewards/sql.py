"""The ``sql_result_match`` verifier and the read-only SQLite sandbox it runs responses in.

A response is SQL (the last fenced ```sql block, else the last fenced block, else the whole text).
It runs against a fresh in-memory database built from the row's ``answer`` (its ``database``
script) and scores 1.0 when its result set equals the oracle's, else 0.0 (or ``valid_sql_credit``
when it ran but returned something else). The sandbox is built per call and guarded in layers:

* an authorizer that allows only reads (SELECT, column reads, recursive CTEs and an allowlist of
  deterministic built-in functions) and denies everything else: ATTACH, PRAGMA, every write,
  ``load_extension``, ``randomblob``, ``zeroblob``, ``random``;
* ``PRAGMA query_only`` on top of it, set before the authorizer goes in;
* per-connection limits: the length of one string or blob, of the statement, attached databases 0;
* a progress handler: a deterministic budget of virtual-machine steps (the same query always ends
  the same way, whatever the load) and a wall-clock backstop;
* ``fetchmany`` with a row limit, and one statement only.

Anything the sandbox stops, and any SQL error, is a response that scored 0, never an exception.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from miniverl.errors import DataError, UsageError
from miniverl.rewards.registry import register_reward

ANSWER_FORMAT = "miniverl-sql-answer/v1"

#: Deterministic built-ins a query may call. Anything else (load_extension, randomblob, zeroblob,
#: random, printf/format (whose width argument builds a huge string in one VM step), ...) is denied.
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

_QUERY_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
#: Building the row's database: tables, their rows, and SQLite's own catalog bookkeeping.
_SETUP_ACTIONS = _QUERY_ACTIONS | {sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_CREATE_INDEX}
_CATALOG = frozenset({"sqlite_master", "sqlite_schema"})


@dataclass(frozen=True)
class SandboxLimits:
    """What one query may use. ``max_steps`` counts SQLite VM steps in units of ``steps_per_check``."""

    max_statement_chars: int = 4_000
    max_rows: int = 1_000
    max_value_bytes: int = 100_000
    max_steps: int = 5_000_000
    steps_per_check: int = 1_000
    max_seconds: float = 5.0
    max_database_chars: int = 200_000


DEFAULT_LIMITS = SandboxLimits()


class SandboxRefusal(Exception):
    """The query did not produce a result: a SQL error, a denied action, or a limit reached."""


@dataclass(frozen=True)
class QueryResult:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def _authorizer(allowed_actions: frozenset[int]) -> Any:
    def authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _trigger: str | None) -> int:
        if action == sqlite3.SQLITE_FUNCTION:
            return sqlite3.SQLITE_OK if (arg2 or "").lower() in ALLOWED_FUNCTIONS else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_UPDATE and allowed_actions is not _QUERY_ACTIONS:
            return sqlite3.SQLITE_OK if arg1 in _CATALOG else sqlite3.SQLITE_DENY  # CREATE TABLE's bookkeeping
        return sqlite3.SQLITE_OK if action in allowed_actions else sqlite3.SQLITE_DENY

    return authorize


class _Budget:
    """The progress handler: stop after ``max_steps`` VM steps or ``max_seconds``, whichever comes first."""

    def __init__(self, limits: SandboxLimits) -> None:
        self.checks_left = max(1, limits.max_steps // limits.steps_per_check)
        self.deadline = time.monotonic() + limits.max_seconds
        self.reason = ""

    def __call__(self) -> int:
        self.checks_left -= 1
        if self.checks_left < 0:
            self.reason = "step budget exhausted"
            return 1
        if time.monotonic() > self.deadline:
            self.reason = "time limit reached"
            return 1
        return 0


def _connect(limits: SandboxLimits) -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=True)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    connection.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000)
    connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(limits.max_statement_chars, limits.max_database_chars))
    return connection


def build_database(script: str, limits: SandboxLimits = DEFAULT_LIMITS) -> sqlite3.Connection:
    """A fresh in-memory database from ``script`` (CREATE TABLE / CREATE INDEX / INSERT only), read-only after.

    A script that does anything else is a :class:`DataError` (the dataset is broken, not the response).
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
        connection.set_authorizer(None)
        connection.execute("PRAGMA query_only = ON")
        connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_statement_chars)
    except sqlite3.Error as exc:
        connection.close()
        why = budget.reason or str(exc)
        raise DataError(f"sql answer: the database script does not build a database ({why})") from None
    connection.set_authorizer(_authorizer(_QUERY_ACTIONS))
    return connection


def run_query(connection: sqlite3.Connection, sql: str, limits: SandboxLimits = DEFAULT_LIMITS) -> QueryResult:
    """Run one read-only statement under the limits; :class:`SandboxRefusal` says why it gave no result."""
    text = sql.strip()
    if not text:
        raise SandboxRefusal("empty statement")
    if len(text) > limits.max_statement_chars:
        raise SandboxRefusal(f"statement longer than {limits.max_statement_chars} characters")
    budget = _Budget(limits)
    connection.set_progress_handler(budget, limits.steps_per_check)
    try:
        cursor = connection.execute(text)
        rows = cursor.fetchmany(limits.max_rows + 1)
        columns = tuple(d[0] for d in cursor.description or ())
        cursor.close()
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as exc:
        raise SandboxRefusal(budget.reason or f"{type(exc).__name__}: {exc}") from None
    finally:
        connection.set_progress_handler(None, 0)
    if not columns:
        raise SandboxRefusal("the statement returns no result set")
    if len(rows) > limits.max_rows:
        raise SandboxRefusal(f"more than {limits.max_rows} rows")
    return QueryResult(columns=columns, rows=tuple(tuple(r) for r in rows))


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


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_sql(response: str) -> str:
    """The SQL of a response: the last ```sql block, else the last fenced block, else the whole text."""
    blocks = _FENCE.findall(response)
    sql_blocks = [body for lang, body in blocks if lang.lower() in ("sql", "sqlite")]
    if sql_blocks:
        return str(sql_blocks[-1]).strip()
    if blocks:
        return str(blocks[-1][1]).strip()
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
    budget, row/length limits, one statement). Rows compare as a multiset unless the question asks
    for an order; column names are ignored, numbers compare rounded to 6 places. A query that runs
    but returns another result scores ``valid_sql_credit`` (default 0); an error or a refusal by
    the sandbox scores 0.
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
    return valid_sql_credit
