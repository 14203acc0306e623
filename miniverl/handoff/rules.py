"""The rules table: which miniverl config fields map to which verl keys, which are dropped, and why.

The tables are data (``rules_v1.json`` for GRPO, ``rules_v2.json`` for PPO with a critic, beside
this module, shipped in the wheel). Each rule is one of

- ``map``: the value carries over exactly to ``verl_keys``;
- ``rebind``: a runtime binding changes (engine, device, where weights come from) but not the math;
- ``drop``: the field has no effect in verl's run (the reason says why that is safe);
- ``drop_with_note``: verl has no counterpart and the field *does* change verl's numerics; the
  compiler compiles anyway and says so where the user reads the result: the note (``code: reason``,
  :func:`note`) is one of the IR's ``deviations``, and the field's own record in the IR names what
  was not carried over (e.g. ``model.quantization``), so the bundle manifest, ``handoff --json`` and
  ``diagnose`` report it. Only where the difference is bounded and stated (never hidden);
- ``refuse``: verl cannot express it exactly; the compiler stops with the rule's ``code``.

``when`` names the condition under which a rule applies (absent: always). The table's canonical
digest is recorded in the IR's manifest and the bundle.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict

from miniverl.canonical import sha256_json
from miniverl.errors import UsageError

Action = Literal["map", "rebind", "drop", "drop_with_note", "refuse"]
#: The actions whose rules carry a ``code`` (the refusal's, or the note's name among the deviations).
CODED: frozenset[str] = frozenset({"refuse", "drop_with_note"})


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    action: Action
    verl_keys: tuple[str, ...]
    reason: str
    code: str | None = None
    when: str | None = None


class RulesTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    compiler: str
    verl_version: str
    rules: tuple[Rule, ...]


class HandoffRefusal(UsageError):
    """verl cannot express a plan exactly; ``code`` names the rule that refused it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"handoff refused ({code}): {message}")
        self.code = code


V1 = "verl-rl-v0.9-single-gpu-v1"
TABLES = {V1: "rules_v1.json", "verl-rl-v0.9-single-gpu-v2": "rules_v2.json"}


@cache
def load_rules(compiler: str = V1) -> RulesTable:
    if compiler not in TABLES:
        raise UsageError(f"no rules table for compiler {compiler!r}")
    text = resources.files("miniverl.handoff").joinpath(TABLES[compiler]).read_text(encoding="utf-8")
    table = RulesTable.model_validate(json.loads(text))
    if table.compiler != compiler:
        raise ValueError(f"{TABLES[compiler]} is the table of {table.compiler}, not {compiler}")
    for rule in table.rules:
        if (rule.action in CODED) != (rule.code is not None):
            verb = "needs" if rule.action in CODED else "has"
            raise ValueError(f"rule {rule.field}: a {rule.action} rule {verb} a code ({', '.join(sorted(CODED))} only)")
    return table


def rules_digest(compiler: str = V1) -> str:
    """sha256 of the rules table's canonical JSON."""
    return sha256_json(load_rules(compiler).model_dump(mode="json"))


def refusal_rule(code: str, compiler: str = V1, *, action: Action = "refuse") -> Rule:
    for rule in load_rules(compiler).rules:
        if rule.code == code and rule.action == action:
            return rule
    raise KeyError(f"no {action} rule with code {code!r}")


def refuse(code: str, detail: str = "", *, compiler: str = V1) -> HandoffRefusal:
    """The :class:`HandoffRefusal` for the rule ``code`` of ``compiler``'s table (its reason, plus ``detail``)."""
    rule = refusal_rule(code, compiler)
    where = f"{rule.field}" + (f" ({detail})" if detail else "")
    return HandoffRefusal(code, f"{where}: {rule.reason}")


def note(code: str, compiler: str = V1) -> str:
    """The deviation a ``drop_with_note`` rule adds to the IR: ``code: reason``."""
    rule = refusal_rule(code, compiler, action="drop_with_note")
    return f"{code}: {rule.reason}"


def render_markdown(compiler: str = V1) -> str:
    """The table as Markdown (the README's copy is checked against this by a test)."""
    lines = ["| miniverl field | when | action | verl keys | why |", "|---|---|---|---|---|"]
    for rule in load_rules(compiler).rules:
        keys = "<br>".join(f"`{k}`" for k in rule.verl_keys) or "-"
        action = f"{rule.action.replace('_', ' ')} `{rule.code}`" if rule.code is not None else rule.action
        lines.append(f"| `{rule.field}` | {rule.when or ''} | {action} | {keys} | {rule.reason} |")
    return "\n".join(lines) + "\n"
