"""The ``sqlite_recovery`` task (RecoveryBench): fix a failed SQL query against a small SQLite database.

Each row holds a generated database (its schema and rows, as the SQL script that builds it), a
question, and a first attempt with a realistic mistake (a wrong column, a missing join condition,
a bad aggregate, an integer division, a misused aggregate, a missing GROUP BY or HAVING) together
with the error or the wrong result it produced. The model answers with corrected SQL; the
``answer`` column holds the oracle SQL, its canonical result and the database script (JSON, see
:class:`miniverl.rewards.sql.SqlAnswer`), which ``sql_result_match`` scores against.

Row ``i`` of seed ``s`` comes from ``random.Random("sqlite_recovery:s:i")`` alone (string seeds
hash with SHA-512, the same in every Python version), so it does not depend on ``rows``. Four
difficulty levels set both the query's shape and the size of the database, so prompts range
from about 100 to about 1,000 tokens. The generator runs every oracle and every first attempt in
the same sandbox the reward uses and keeps a row only when the oracle returns rows and the
attempt fails or returns something else.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from miniverl.canonical import sha256_json
from miniverl.rewards.sql import (
    QueryResult,
    SandboxRefusal,
    SqlAnswer,
    canonical_rows,
    execute_sandboxed,
    results_match,
)

TASK = "sqlite_recovery"
INSTRUCTION = "Reply with the corrected query in one ```sql block."
LEVELS = (1, 2, 3, 4)
#: (parents, children) rows per difficulty level
_SIZES = {1: ((2, 3), (3, 4)), 2: ((4, 5), (7, 9)), 3: ((5, 7), (12, 16)), 4: ((8, 10), (26, 34))}
_YEARS = (2021, 2022, 2023, 2024)
_NAMES = (
    "Ava", "Ben", "Chloe", "Dev", "Elif", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Kai", "Lena",
    "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tara", "Uma", "Viktor", "Wen", "Yara",
)  # fmt: skip


@dataclass(frozen=True)
class _Domain:
    parent: str  # table, plural ("customers")
    group: str  # a category column of the parent ("city")
    groups: tuple[str, ...]
    child: str  # table, plural ("orders")
    fk: str  # child column referencing parent.id
    item: str  # a category column of the child ("product")
    items: tuple[str, ...]
    qty: str  # a small integer column ("quantity")
    amount: str  # a money column, REAL with two decimals ("price")
    year: str  # an integer year column
    wrong_qty: str  # a plausible column name that does not exist
    wrong_amount: str


_DOMAINS = (
    _Domain(
        "customers", "city", ("Lyon", "Porto", "Oslo", "Riga", "Graz"),
        "orders", "customer_id", "product", ("lamp", "desk", "chair", "shelf", "rug", "kettle"),
        "quantity", "price", "order_year", "qty", "cost",
    ),
    _Domain(
        "students", "house", ("north", "south", "east", "west"),
        "enrollments", "student_id", "course", ("algebra", "biology", "chemistry", "drawing", "economics"),
        "credits", "fee", "term_year", "credit", "price",
    ),
    _Domain(
        "members", "branch", ("central", "harbour", "hillside", "market"),
        "loans", "member_id", "genre", ("crime", "fantasy", "history", "poetry", "travel"),
        "days", "fine", "loan_year", "duration", "fee",
    ),
    _Domain(
        "patients", "ward", ("A", "B", "C", "D"),
        "visits", "patient_id", "treatment", ("checkup", "xray", "therapy", "vaccine", "surgery"),
        "minutes", "cost", "visit_year", "duration", "price",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class _Mistake:
    sql: str
    kind: str  # wrong_column | missing_join_condition | bad_aggregate | type_error | ...
    explanation: str


@dataclass(frozen=True)
class _Query:
    question: str
    sql: str
    ordered: bool
    mistakes: tuple[_Mistake, ...]


def _database(rng: random.Random, d: _Domain, level: int) -> tuple[str, list[dict[str, Any]]]:
    """The script that builds the database, and the child rows (the questions draw values from them)."""
    (p_low, p_high), (c_low, c_high) = _SIZES[level]
    names = rng.sample(_NAMES, rng.randint(p_low, p_high))
    parents = [(i + 1, name, rng.choice(d.groups)) for i, name in enumerate(names)]
    children = []
    for i in range(rng.randint(c_low, c_high)):
        children.append(
            {
                "id": i + 1,
                "fk": rng.randint(1, len(parents)),
                "item": rng.choice(d.items),
                "qty": rng.randint(1, 9),
                "amount": rng.randint(250, 9_999) / 100,
                "year": rng.choice(_YEARS),
            }
        )
    parent_values = ", ".join(f"({i}, '{name}', '{group}')" for i, name, group in parents)
    child_values = ", ".join(
        f"({c['id']}, {c['fk']}, '{c['item']}', {c['qty']}, {c['amount']:.2f}, {c['year']})" for c in children
    )
    script = (
        f"CREATE TABLE {d.parent} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {d.group} TEXT NOT NULL);\n"
        f"INSERT INTO {d.parent} VALUES {parent_values};\n"
        f"CREATE TABLE {d.child} (id INTEGER PRIMARY KEY, {d.fk} INTEGER NOT NULL REFERENCES {d.parent}(id), "
        f"{d.item} TEXT NOT NULL, {d.qty} INTEGER NOT NULL, {d.amount} REAL NOT NULL, {d.year} INTEGER NOT NULL);\n"
        f"INSERT INTO {d.child} VALUES {child_values};"
    )
    return script, children


def _level1(rng: random.Random, d: _Domain, children: list[dict[str, Any]]) -> _Query:
    if rng.random() < 0.5:
        n = rng.randint(2, 7)
        sql = f"SELECT COUNT(*) FROM {d.child} WHERE {d.qty} > {n}"
        return _Query(
            f"How many {d.child} have a {d.qty} greater than {n}?",
            sql,
            False,
            (
                _Mistake(sql.replace(f"WHERE {d.qty}", f"WHERE {d.wrong_qty}"), "wrong_column",
                         f"uses a column {d.wrong_qty} that {d.child} does not have; the column is {d.qty}"),
                _Mistake(f"SELECT SUM({d.qty}) FROM {d.child} WHERE {d.qty} > {n}", "bad_aggregate",
                         f"adds up {d.qty} with SUM where the question counts rows with COUNT(*)"),
            ),
        )  # fmt: skip
    year = rng.choice([c["year"] for c in children])
    sql = f"SELECT ROUND(SUM({d.amount}), 2) FROM {d.child} WHERE {d.year} = {year}"
    return _Query(
        f"What is the total {d.amount} of all {d.child} in {year}, rounded to 2 decimals?",
        sql,
        False,
        (
            _Mistake(f"SELECT ROUND(COUNT({d.amount}), 2) FROM {d.child} WHERE {d.year} = {year}", "bad_aggregate",
                     f"counts the {d.child} with COUNT where the question asks for the SUM of {d.amount}"),
            _Mistake(f"SELECT ROUND(SUM({d.wrong_amount}), 2) FROM {d.child} WHERE {d.year} = {year}",
                     "wrong_column", f"uses a column {d.wrong_amount} that does not exist; the column is {d.amount}"),
        ),
    )  # fmt: skip


def _level2(rng: random.Random, d: _Domain, children: list[dict[str, Any]]) -> _Query:
    if rng.random() < 0.5:
        sql = f"SELECT {d.item}, COUNT(*) FROM {d.child} GROUP BY {d.item}"
        return _Query(
            f"For each {d.item}, how many {d.child} are there?",
            sql,
            False,
            (
                _Mistake(f"SELECT {d.item}, COUNT(*) FROM {d.child}", "missing_group_by",
                         f"has no GROUP BY {d.item}, so it returns one row for the whole table"),
                _Mistake(f"SELECT {d.item}, COUNT(*) FROM {d.child} GROUP BY {d.fk}", "wrong_column",
                         f"groups by {d.fk} instead of {d.item}"),
            ),
        )  # fmt: skip
    sql = f"SELECT {d.item}, ROUND(AVG({d.qty}), 2) FROM {d.child} GROUP BY {d.item}"
    return _Query(
        f"What is the average {d.qty} of the {d.child} for each {d.item}, rounded to 2 decimals?",
        sql,
        False,
        (
            _Mistake(f"SELECT {d.item}, SUM({d.qty}) / COUNT(*) FROM {d.child} GROUP BY {d.item}", "type_error",
                     f"divides two integers, so SQLite truncates the average; AVG({d.qty}) "
                     "(or a REAL operand) keeps the fraction"),
            _Mistake(f"SELECT {d.item}, ROUND(AVG({d.wrong_qty}), 2) FROM {d.child} GROUP BY {d.item}",
                     "wrong_column", f"uses a column {d.wrong_qty} that does not exist; the column is {d.qty}"),
        ),
    )  # fmt: skip


def _level3(rng: random.Random, d: _Domain, children: list[dict[str, Any]]) -> _Query:
    if rng.random() < 0.5:
        sql = (
            f"SELECT p.{d.group}, SUM(c.{d.qty}) AS total FROM {d.parent} p JOIN {d.child} c ON c.{d.fk} = p.id "
            f"GROUP BY p.{d.group} ORDER BY total DESC, p.{d.group}"
        )
        return _Query(
            f"For each {d.group} of the {d.parent}, what is the total {d.qty} of their {d.child}? "
            f"Order by the total, largest first, then by {d.group}.",
            sql,
            True,
            (
                _Mistake(sql.replace(f" JOIN {d.child} c ON c.{d.fk} = p.id", f", {d.child} c"),
                         "missing_join_condition",
                         f"joins {d.parent} and {d.child} without c.{d.fk} = p.id, so every pair is counted"),
                _Mistake(sql.replace("ORDER BY total DESC", "ORDER BY total"), "wrong_order",
                         "orders the totals smallest first"),
            ),
        )  # fmt: skip
    totals: dict[int, float] = {}
    for c in children:
        totals[c["fk"]] = totals.get(c["fk"], 0.0) + c["amount"]
    threshold = round(sorted(totals.values())[len(totals) // 2]) if totals else 50
    sql = (
        f"SELECT p.name FROM {d.parent} p JOIN {d.child} c ON c.{d.fk} = p.id "
        f"GROUP BY p.id, p.name HAVING SUM(c.{d.amount}) > {threshold}"
    )
    return _Query(
        f"Which {d.parent} have a total {d.amount} over all their {d.child} above {threshold}? List their names.",
        sql,
        False,
        (
            _Mistake(f"SELECT p.name FROM {d.parent} p JOIN {d.child} c ON c.{d.fk} = p.id "
                     f"WHERE SUM(c.{d.amount}) > {threshold} GROUP BY p.id, p.name", "bad_aggregate",
                     "filters on an aggregate in WHERE; a condition on SUM belongs in HAVING"),
            _Mistake(f"SELECT p.name FROM {d.parent} p JOIN {d.child} c ON c.{d.fk} = p.id "
                     f"WHERE c.{d.amount} > {threshold} GROUP BY p.id, p.name", "bad_aggregate",
                     f"compares each single {d.amount} with the threshold instead of the total"),
        ),
    )  # fmt: skip


def _level4(rng: random.Random, d: _Domain, children: list[dict[str, Any]]) -> _Query:
    if rng.random() < 0.5:
        year = rng.choice([c["year"] for c in children])
        sql = (
            f"SELECT p.name, ROUND(SUM(c.{d.amount}), 2) AS total FROM {d.parent} p "
            f"JOIN {d.child} c ON c.{d.fk} = p.id WHERE c.{d.year} = {year} "
            f"GROUP BY p.id, p.name ORDER BY total DESC, p.name LIMIT 3"
        )
        return _Query(
            f"Which 3 {d.parent} have the highest total {d.amount} in {year}? Give each name with the total "
            "rounded to 2 decimals, highest first (ties by name).",
            sql,
            True,
            (
                _Mistake(sql.replace(f"ON c.{d.fk} = p.id", f"ON c.{d.fk} = p.{d.fk}"), "wrong_column",
                         f"joins on p.{d.fk}, a column of {d.child}, not of {d.parent}; the key is p.id"),
                _Mistake(sql.replace("GROUP BY p.id, p.name", "GROUP BY id"), "wrong_column",
                         "groups by id, which both tables have; it must say p.id"),
            ),
        )  # fmt: skip
    sql = (
        f"SELECT p.{d.group}, c.{d.item}, COUNT(*) AS n, SUM(c.{d.qty}) AS total FROM {d.parent} p "
        f"JOIN {d.child} c ON c.{d.fk} = p.id GROUP BY p.{d.group}, c.{d.item} HAVING COUNT(*) >= 2 "
        f"ORDER BY p.{d.group}, c.{d.item}"
    )
    return _Query(
        f"For each pair of {d.group} and {d.item} with at least 2 {d.child}, give the number of {d.child} "
        f"and their total {d.qty}, ordered by {d.group} and then {d.item}.",
        sql,
        True,
        (
            _Mistake(sql.replace(" HAVING COUNT(*) >= 2", ""), "missing_having",
                     f"keeps the pairs with a single {d.child[:-1]}; "
                     "the question wants at least 2 (HAVING COUNT(*) >= 2)"),
            _Mistake(sql.replace(f"JOIN {d.child} c ON c.{d.fk} = p.id", f"JOIN {d.child} c"),
                     "missing_join_condition", f"joins without c.{d.fk} = p.id, so every pair of rows is counted"),
        ),
    )  # fmt: skip


_QUESTIONS: dict[int, Callable[[random.Random, _Domain, list[dict[str, Any]]], _Query]] = {
    1: _level1,
    2: _level2,
    3: _level3,
    4: _level4,
}
_MAX_SHOWN_ROWS = 6
_MAX_DRAWS = 64


def _show(result: QueryResult) -> str:
    rows = canonical_rows(result.rows)
    text = json.dumps(rows[:_MAX_SHOWN_ROWS], separators=(", ", ": "), ensure_ascii=False)
    return text + (f" (+{len(rows) - _MAX_SHOWN_ROWS} more rows)" if len(rows) > _MAX_SHOWN_ROWS else "")


@dataclass(frozen=True)
class _Draft:
    level: int
    database: str
    query: _Query
    expected: QueryResult
    mistake: _Mistake
    outcome: str  # what the first attempt produced, as shown to the model


def _draft(rng: random.Random) -> _Draft:
    """One usable problem: the oracle returns rows and the chosen mistake fails or returns something else."""
    for _ in range(_MAX_DRAWS):
        level = rng.choice(LEVELS)
        domain = rng.choice(_DOMAINS)
        database, children = _database(rng, domain, level)
        query = _QUESTIONS[level](rng, domain, children)
        mistake = rng.choice(query.mistakes)
        expected = execute_sandboxed(database, query.sql)  # a refusal here is a generator bug: let it raise
        if not expected.rows or any(v is None for row in expected.rows for v in row):
            continue
        try:
            attempt = execute_sandboxed(database, mistake.sql)
        except SandboxRefusal as exc:
            return _Draft(level, database, query, expected, mistake, f"It failed with: {exc}")
        if results_match(expected.rows, attempt.rows, ordered=query.ordered):
            continue  # this mistake happens to give the right answer on this database: draw again
        return _Draft(level, database, query, expected, mistake, f"It returned {_show(attempt)}, which is wrong.")
    raise RuntimeError("sqlite_recovery: no usable problem in 64 draws (a generator bug)")


def sqlite_recovery_row(seed: int, index: int) -> dict[str, str]:
    """Row ``index`` of seed ``seed`` (depends on nothing else)."""
    return _leveled_row(seed, index)[0]


def _leveled_row(seed: int, index: int) -> tuple[dict[str, str], int]:
    draft = _draft(random.Random(f"{TASK}:{seed}:{index}"))
    prompt = (
        "You are fixing a SQL query for a SQLite database.\n\n"
        f"Database:\n{draft.database}\n\n"
        f"Question: {draft.query.question}\n\n"
        f"First attempt:\n```sql\n{draft.mistake.sql}\n```\n{draft.outcome}\n\n"
        f"{INSTRUCTION}"
    )
    context = (  # a complete oracle response: the target of SFT (target_column: context) and an OPD teacher's hint
        f"The first attempt {draft.mistake.explanation}. A corrected query:\n"
        f"```sql\n{draft.query.sql}\n```\nIt returns {_show(draft.expected)}."
    )
    answer = SqlAnswer(
        database=draft.database,
        sql=draft.query.sql,
        columns=draft.expected.columns,
        rows=canonical_rows(draft.expected.rows),
        ordered=draft.query.ordered,
    )
    row = {
        "prompt_id": f"sql-{seed}-{index}",
        "prompt": prompt,
        "answer": answer.to_json(),
        "context": context,
        "task": TASK,
    }
    return row, draft.level


def generate_sqlite_recovery(rows: int, seed: int) -> list[dict[str, str]]:
    """``rows`` RecoveryBench problems as prompt-dataset rows (``prompt_id`` is ``sql-<seed>-<index>``)."""
    return [sqlite_recovery_row(seed, index) for index in range(rows)]


def oracle_response(sql: str) -> str:
    """The response an oracle gives: the corrected query in one ```sql block."""
    return f"```sql\n{sql}\n```"


def mistake_response(row: dict[str, str]) -> str:
    """The first attempt of a row, as a response (it must score 0)."""
    prompt = row["prompt"]
    start = prompt.index("First attempt:\n```sql\n") + len("First attempt:\n```sql\n")
    return oracle_response(prompt[start : prompt.index("\n```", start)])


# ---- the eight oracle trajectories -------------------------------------------------------------

ORACLE_SEED = 0
#: Which rows of seed ORACLE_SEED: the first two of each level, in the order levels 1-4, 1-4.
ORACLE_COUNT = 8
#: sha256 of the canonical JSON of :func:`oracle_trajectories` (the test recomputes it).
ORACLE_TRAJECTORIES_SHA256 = "162c31e28404bd46b60e8990341694156290e185659abdf8121da3a60f108291"


@dataclass(frozen=True)
class OracleTrajectory:
    """A (prompt, oracle response) pair of RecoveryBench, with the row it came from."""

    prompt_id: str
    level: int
    prompt: str
    response: str
    row: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_id": self.prompt_id, "level": self.level, "prompt": self.prompt, "response": self.response}


def _build_oracle_trajectories() -> list[OracleTrajectory]:
    per_level = ORACLE_COUNT // len(LEVELS)
    by_level: dict[int, list[dict[str, str]]] = {level: [] for level in LEVELS}
    index = 0
    while any(len(found) < per_level for found in by_level.values()):
        row, level = _leveled_row(ORACLE_SEED, index)
        if len(by_level[level]) < per_level:
            by_level[level].append(row)
        index += 1
    return [
        OracleTrajectory(
            prompt_id=row["prompt_id"],
            level=level,
            prompt=row["prompt"],
            response=oracle_response(json.loads(row["answer"])["sql"]),
            row=row,
        )
        for k in range(per_level)
        for level in LEVELS
        for row in [by_level[level][k]]
    ]


def oracle_trajectories_digest(trajectories: list[OracleTrajectory]) -> str:
    return sha256_json([t.to_dict() for t in trajectories])


def oracle_trajectories(*, verify: bool = True) -> list[OracleTrajectory]:
    """The eight deterministic RecoveryBench oracle trajectories (two per level), checked against their pin."""
    trajectories = _build_oracle_trajectories()
    if verify:
        digest = oracle_trajectories_digest(trajectories)
        if digest != ORACLE_TRAJECTORIES_SHA256:
            raise RuntimeError(
                f"the sqlite_recovery oracle trajectories changed: sha256 {digest}, pinned {ORACLE_TRAJECTORIES_SHA256}"
            )
    return trajectories
