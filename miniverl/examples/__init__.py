"""Starter projects shipped in the wheel: ``miniverl init DIR --example NAME``.

Each example is a folder here with ``config.yaml`` and ``prompts.jsonl`` (one prompt row per line,
the five dataset columns), and may hold ``heldout.jsonl``: prompts kept out of training, for
``miniverl eval``. ``init`` copies the config and writes each prompt file as the Parquet file the
config (and the printed eval command) names. An example may take its prompt files from another
example's folder (``PROMPTS_FROM``), so one dataset is shipped once. Nothing here imports torch.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError

EXAMPLES: dict[str, str] = {
    "grpo": "GRPO on calculator word problems, embedded SmolLM2, CPU: held-out accuracy rises in ~15 min on 2 cores",
    "grpo-gpu": "the same task at GPU scale (16 prompts x 8 samples, bf16): a larger gain in a few minutes",
    "opd": "strict on-policy distillation from a privileged-context teacher (the same base seeing the worked answer)",
    "ppo": "PPO with a critic (second LoRA + value head), GAE, rule rewards and a tiny reward-model role",
    "sql": "GRPO on SQLite RecoveryBench: fix a failed query; sql_result_match runs it in a read-only sandbox",
}
PROMPTS_FROM: dict[str, str] = {"grpo-gpu": "grpo"}
PROMPT_FILES = {"prompts.jsonl": "prompts.parquet", "heldout.jsonl": "heldout.parquet"}


def _prompt_folder(name: str) -> str:
    return PROMPTS_FROM.get(name, name)


def example_files(name: str) -> tuple[str, ...]:
    """What ``init --example name`` writes: the config, the training prompts, and held-out prompts if any."""
    folder = resources.files(__package__).joinpath(_prompt_folder(name))
    return ("config.yaml", *(out for src, out in PROMPT_FILES.items() if folder.joinpath(src).is_file()))


def example_file(name: str, filename: str) -> str:
    folder = _prompt_folder(name) if filename in PROMPT_FILES else name
    return resources.files(__package__).joinpath(folder, filename).read_text(encoding="utf-8")


def _rows(name: str, filename: str) -> list[Any]:
    rows = []
    for number, line in enumerate(example_file(name, filename).splitlines(), start=1):
        try:
            rows.append(loads_json(line))
        except StrictFormatError as exc:  # a broken wheel, not a user error
            raise RuntimeError(f"packaged example {name} {filename} line {number}: {exc}") from None
    return rows


def write_example(name: str, directory: Path, *, force: bool = False) -> dict[str, Any]:
    """Write ``config.yaml``, ``prompts.parquet`` (and ``heldout.parquet``) of example ``name`` into ``directory``."""
    from miniverl.artifacts.rundir import check_writable_dir
    from miniverl.canonical import atomic_write_text
    from miniverl.data import write_prompts
    from miniverl.outputs import check_file_target

    if name not in EXAMPLES:
        raise UsageError(f"unknown example {name!r}; examples: {', '.join(sorted(EXAMPLES))}")
    check_writable_dir(directory, option="init DIR")
    files = example_files(name)
    in_the_way = [f for f in files if (directory / f).is_dir()]
    if in_the_way:  # --force replaces files, never a directory
        raise UsageError(f"{directory}: {', '.join(in_the_way)} is a directory; give a DIR without it")
    for f in files:  # a device, FIFO or socket in the way is refused before any file is written
        check_file_target(directory / f, what="init")
    existing = [f for f in files if (directory / f).exists()]
    if existing and not force:
        raise UsageError(f"{directory} already has {', '.join(existing)}; pick an empty DIR or pass --force")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. under a read-only or virtual filesystem that access() calls writable
        raise UsageError(f"init DIR {directory}: cannot create it ({exc.strerror})") from None
    config_text = example_file(name, "config.yaml")
    rows = _rows(name, "prompts.jsonl")
    digest = write_prompts(directory / "prompts.parquet", rows)
    result: dict[str, Any] = {
        "example": name,
        "directory": str(directory),
        "files": list(files),
        "rows": len(rows),
        "data_sha256": digest,
    }
    if "heldout.parquet" in files:
        heldout = _rows(name, "heldout.jsonl")
        result["heldout_rows"] = len(heldout)
        result["heldout_sha256"] = write_prompts(directory / "heldout.parquet", heldout)
    atomic_write_text(directory / "config.yaml", config_text)
    return result
