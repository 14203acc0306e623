"""Collects check outcomes into executed / skipped / not_applicable (disjoint) for a record."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.core.records import CheckResult, Checks, NotRun


@dataclass
class CheckBook:
    required: list[str]
    executed: list[CheckResult] = field(default_factory=list)
    skipped: list[NotRun] = field(default_factory=list)
    not_applicable: list[NotRun] = field(default_factory=list)

    def _seen(self) -> set[str]:
        return {c.name for c in self.executed} | {c.name for c in self.skipped} | {c.name for c in self.not_applicable}

    def record(self, name: str, passed: bool, detail: str) -> bool:
        if name in self._seen():
            raise ValueError(f"check {name} recorded twice")
        self.executed.append(CheckResult(name=name, passed=bool(passed), detail=detail[:500]))
        return bool(passed)

    def skip(self, name: str, reason: str) -> None:
        if name not in self._seen():
            self.skipped.append(NotRun(name=name, reason=reason[:500]))

    def not_applicable_(self, name: str, reason: str) -> None:
        if name not in self._seen():
            self.not_applicable.append(NotRun(name=name, reason=reason))

    def skip_remaining(self, names: list[str], reason: str) -> None:
        for name in names:
            self.skip(name, reason)

    def passed(self, name: str) -> bool:
        return any(c.name == name and c.passed for c in self.executed)

    def failures_so_far(self) -> list[str]:
        """``Checks.failures`` over the checks decided so far (the required ones not yet recorded are left out)."""
        seen = self._seen()
        return Checks(
            required=[name for name in self.required if name in seen],
            executed=list(self.executed),
            skipped=list(self.skipped),
            not_applicable=list(self.not_applicable),
        ).failures()

    def checks(self) -> Checks:
        return Checks(
            required=list(self.required),
            executed=list(self.executed),
            skipped=list(self.skipped),
            not_applicable=list(self.not_applicable),
        )
