"""The backend-matrix workload's layout: its name, steps and outputs, the preregistration it is judged against
(:data:`PREREGISTRATION`, committed before any measurement and read from its fixed path in the harness) and the
refresh checks' module (:mod:`harness.qualify.full.refresh`)."""

from __future__ import annotations

import importlib
import importlib.util
import math
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from harness.core.jsonio import loads_strict, sha256_file
from harness.core.proc import HARNESS_DIR
from harness.core.records import Record

NAME = "backend-matrix"
FOLDER = "v011/backend-matrix"
PREREGISTRATION = HARNESS_DIR / "preregistration" / "backend-matrix-v3.json"
PREREGISTRATION_SCHEMA = HARNESS_DIR / "preregistration" / "backend-matrix-v3.schema.json"
GATE_STEP, BENCH_STEP = "gate_equivalence", "bench_rollout"
GATE_OUT, BENCH_OUT = "gate/equivalence-report.json", "bench"
# `miniverl gate equivalence --model` takes the scale's name; the report names the gate's model choice.
GATE_MODEL = {"tiny": "tiny", "smollm2-135m-instruct": "smollm2", "qwen3-0.6b-shape": "qwen3-0.6b-shape"}
COMPARISONS = (
    "loss_abs_diff",
    "grad_max_abs_diff",
    "grad_max_rel_to_reference_max",
    "updated_logit_max_abs_diff",
    "updated_logit_max_rel_to_reference_max",
)
DIGESTS = ("trajectory_digest", "target_digest", "student_init_digest")
Objective = Literal["sft", "kd", "opd"]
RuntimeName = Literal["dual_model", "shared_backbone"]
Batch = Literal[1, 2, 4, "auto"]


# -- the preregistration (committed before any measurement) -------------------------------------------------------
class Cell(Record):
    objective: Objective
    runtime: RuntimeName
    trajectory_batch_size: Batch


class Tolerances(Record):
    """The most each comparison may observe, over every cell of one objective against its reference cell."""

    loss_abs_diff: float
    grad_max_abs_diff: float
    grad_max_rel_to_reference_max: float
    updated_logit_max_abs_diff: float
    updated_logit_max_rel_to_reference_max: float


class Conformance(Record):
    """Per objective and physical batch, ``dual_model`` and ``shared_backbone`` agree exactly."""

    rule: str
    max_abs_diff: float
    same_physical_plan: Literal[True]
    identical_across_cells: list[Literal["trajectory_digest", "target_digest", "student_init_digest"]]


class SpeedBench(Record):
    """``miniverl bench rollout`` at a small fixed size; both paths are measured in the same run, and timed against
    each other in ``pairs`` interleaved pairs (fast, baseline, fast, baseline, ...)."""

    model: Literal["tiny", "qwen3-0.6b-shape"]
    batch: int
    new_tokens: int
    prompt_tokens: int
    warmup: int
    repeats: int
    slow_repeats: int
    fast_path: Literal["fast", "fast_eager", "fast_compiled"]
    baseline_path: Literal["hf_loop", "hf_generate"]
    pairs: Annotated[int, Field(ge=5)]


class SpeedThreshold(Record):
    """The least median ratio on a dedicated CUDA machine (where the policy requires ``speed_thresholds``)."""

    device: Literal["cuda"]
    minimum_ratio: float
    meaning: str


class Speed(Record):
    metric: Literal["median_of_interleaved_pair_ratios_fast_over_baseline_tokens_per_second"]
    bench: SpeedBench
    thresholds: list[SpeedThreshold]


class BackendMatrixPreregistration(Record):
    kind: Literal["miniverl.preregistration.backend-matrix"]
    schema_version: Literal[1]
    issue: int
    description: str
    gate_argv: list[str]
    objectives: list[Objective]
    runtimes: list[RuntimeName]
    batches: list[Batch]
    cells: list[Cell]
    tolerances: dict[Objective, Tolerances]
    conformance: Conformance
    speed: Speed

    @model_validator(mode="after")
    def _consistent(self) -> BackendMatrixPreregistration:
        product = [(o, r, b) for o in self.objectives for b in self.batches for r in self.runtimes]
        listed = [(c.objective, c.runtime, c.trajectory_batch_size) for c in self.cells]
        if listed != product or len(set(listed)) != len(listed):
            raise ValueError("cells must be objectives x batches x runtimes, in that order, each once")
        if set(self.tolerances) != set(self.objectives):
            raise ValueError("one tolerance set per objective")
        if self.conformance.max_abs_diff != 0.0:
            raise ValueError("conformance is exact: max_abs_diff 0")
        if [t.device for t in self.speed.thresholds] != ["cuda"]:
            raise ValueError("one speed threshold, for cuda (a shared CPU records the figure, never judges it)")
        values = [v for t in self.tolerances.values() for v in t.model_dump().values()]
        values += [t.minimum_ratio for t in self.speed.thresholds]
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError("tolerances and thresholds are finite and positive")
        return self


def load_preregistration() -> tuple[BackendMatrixPreregistration, str]:
    """The committed preregistration (by its fixed path in the harness) and its sha256."""
    data = PREREGISTRATION.read_bytes()
    prereg = BackendMatrixPreregistration.model_validate(loads_strict(data, PREREGISTRATION.name))
    return prereg, sha256_file(PREREGISTRATION)


# -- the refresh checks (harness/qualify/full/refresh.py, another module) -----------------------------------------
REFRESH_CHECKS = ("policy_refreshes", "grouped_trajectory_identity", "vllm_boundary")


def refresh_module() -> Any | None:
    if importlib.util.find_spec("harness.qualify.full.refresh") is None:
        return None
    return importlib.import_module("harness.qualify.full.refresh")


def refresh_evidence() -> dict[str, str]:
    module = refresh_module()
    return dict(getattr(module, "REFRESH_EVIDENCE", {})) if module is not None else {}
