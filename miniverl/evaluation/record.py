"""``RUN/eval/step-KKKKKK.json``: what ``miniverl eval`` measured on a run's checkpoint, kept in the run.

One file per evaluated step (a later eval of the same step replaces it). It holds no path of the machine
that wrote it: the eval data is named by its file name and identified by its sha256.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from miniverl import bounded
from miniverl.canonical import atomic_write_json
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError
from miniverl.records import SHA256, Record

EVAL_DIR = "eval"


class ComponentSummary(Record):
    mean: float | None
    fraction_positive: float | None = Field(
        description="share of responses whose component is > 0 (an accuracy for a 0/1 reward); null when the "
        "component took values other than 0 and 1"
    )


class EvalSummary(Record):
    trajectories: int = Field(ge=0)
    prompts: int = Field(ge=0)
    reward_mean: float | None
    response_tokens_mean: float | None
    components: dict[str, ComponentSummary]


class EvalDifference(Record):
    """``trained - base`` for every number both summaries have (null where either lacks it)."""

    reward_mean: float | None
    response_tokens_mean: float | None
    components: dict[str, dict[str, float | None]]


class EvalDecoding(Record):
    samples: int = Field(ge=1, description="responses per prompt (1 for greedy)")
    temperature: float = Field(ge=0, description="0: greedy")
    top_p: float
    top_k: int
    max_new_tokens: int
    batch_size: int
    seed: int
    use_chat_template: bool


class EvalMode(Record):
    decoding: EvalDecoding
    base: EvalSummary = Field(description="the student with its adapter off")
    trained: EvalSummary = Field(description="the student with the checkpoint's adapter")
    difference: EvalDifference


class EvalData(Record):
    name: str = Field(description="the eval data's file name (no directory)")
    sha256: str = SHA256
    rows: int = Field(ge=0)


class EvalRecord(Record):
    kind: Literal["miniverl.eval"] = "miniverl.eval"
    schema_version: Literal[1] = 1
    run_id: str
    step: int = Field(ge=0, description="the evaluated checkpoint's optimizer update")
    plan_digest: str = SHA256
    miniverl_version: str
    data: EvalData
    seed: int
    rewards: list[str]
    modes: dict[Literal["greedy", "sampled"], EvalMode]
    seconds: float = Field(ge=0, description="wall time of the generation and scoring (model load excluded)")


def eval_record(result: dict[str, Any], run_id: str) -> EvalRecord:
    """The record of an :func:`miniverl.evaluation.runner.evaluate` result on a run's checkpoint."""
    from miniverl import __version__

    modes = {
        mode: EvalMode(decoding=EvalDecoding(**result["settings"][mode]), **result[mode])
        for mode in ("greedy", "sampled")
        if mode in result
    }
    return EvalRecord(
        run_id=run_id,
        step=result["source"]["step"],
        plan_digest=result["source"]["plan_digest"],
        miniverl_version=__version__,
        data=EvalData(
            name=Path(result["data"]["path"]).name, sha256=result["data"]["sha256"], rows=result["data"]["rows"]
        ),
        seed=result["settings"]["greedy"]["seed"],
        rewards=list(result["rewards"]),
        modes=modes,
        seconds=result["seconds"],
    )


def eval_path(run_dir: Path, step: int) -> Path:
    return run_dir / EVAL_DIR / f"step-{step:06d}.json"


def write_eval(run_dir: Path, record: EvalRecord) -> Path:
    """Write the record atomically into ``RUN/eval/`` (refusing a symlinked ``eval/``); return its path."""
    directory = run_dir / EVAL_DIR
    if directory.is_symlink():
        raise UsageError(f"{directory} is a symlink; eval writes only into real directories (remove the link)")
    path = eval_path(run_dir, record.step)
    atomic_write_json(path, record.model_dump(mode="json"), pretty=True)
    return path


def read_evals(run_dir: Path) -> list[EvalRecord]:
    """Every ``RUN/eval/step-*.json``, by step; a file that is not an eval record is a usage error."""
    directory = run_dir / EVAL_DIR
    if directory.is_symlink() or not directory.is_dir():
        return []
    out = []
    for path in sorted(directory.glob("step-*.json")):
        try:
            value = loads_json(bounded.read_text(path, limit=bounded.PLAN_MAX_BYTES, what="an eval record"))
            out.append(EvalRecord.model_validate(value))
        except (StrictFormatError, UnicodeDecodeError, IsADirectoryError):
            raise UsageError(f"{path} is not a JSON eval record; remove it or rerun `miniverl eval`") from None
        except ValidationError:
            raise UsageError(f"{path} does not match the eval record schema; rerun `miniverl eval`") from None
    return sorted(out, key=lambda record: record.step)


def keep_in_run(run_dir: Path, result: dict[str, Any]) -> str | None:
    """Write the result of an eval of ``run_dir`` into it; the path written, or None (with a notice on stderr)
    when the run directory cannot be written (the result is still printed, nothing is claimed on disk)."""
    import sys

    from miniverl.artifacts.rundir import read_manifest

    record = eval_record(result, read_manifest(run_dir).run_id)
    try:
        return str(write_eval(run_dir, record))
    except OSError as exc:
        sys.stderr.write(f"notice: the eval was not kept in {run_dir / EVAL_DIR} ({exc.strerror or exc})\n")
        return None
