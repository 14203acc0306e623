"""Starter projects shipped in the wheel: ``miniverl init DIR --example NAME``.

Each example is a folder here with ``config.yaml`` and ``prompts.jsonl`` (one prompt row per line,
the five dataset columns). ``init`` copies the config and writes the prompts as the Parquet file
the config names. Nothing here imports torch.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError

EXAMPLES: dict[str, str] = {
    "grpo": "GRPO with calculator + length rewards on the embedded SmolLM2 (learns on CPU)",
    "opd": "strict on-policy distillation from a privileged-context teacher (the same base seeing the worked answer)",
    "ppo": "PPO with a critic (second LoRA + value head), GAE, rule rewards and a tiny reward-model role",
    "sql": "GRPO on SQLite RecoveryBench: fix a failed query; sql_result_match runs it in a read-only sandbox",
}
FILES = ("config.yaml", "prompts.parquet")


def example_file(name: str, filename: str) -> str:
    return resources.files(__package__).joinpath(name, filename).read_text(encoding="utf-8")


def write_example(name: str, directory: Path, *, force: bool = False) -> dict[str, Any]:
    """Write ``config.yaml`` and ``prompts.parquet`` of example ``name`` into ``directory``."""
    from miniverl.artifacts.rundir import check_writable_dir
    from miniverl.canonical import atomic_write_text
    from miniverl.data import write_prompts

    if name not in EXAMPLES:
        raise UsageError(f"unknown example {name!r}; examples: {', '.join(sorted(EXAMPLES))}")
    check_writable_dir(directory, option="init DIR")
    in_the_way = [f for f in FILES if (directory / f).is_dir()]
    if in_the_way:  # --force replaces files, never a directory
        raise UsageError(f"{directory}: {', '.join(in_the_way)} is a directory; give a DIR without it")
    existing = [f for f in FILES if (directory / f).exists()]
    if existing and not force:
        raise UsageError(f"{directory} already has {', '.join(existing)}; pick an empty DIR or pass --force")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. under a read-only or virtual filesystem that access() calls writable
        raise UsageError(f"init DIR {directory}: cannot create it ({exc.strerror})") from None
    rows = []
    for number, line in enumerate(example_file(name, "prompts.jsonl").splitlines(), start=1):
        try:
            rows.append(loads_json(line))
        except StrictFormatError as exc:  # a broken wheel, not a user error
            raise RuntimeError(f"packaged example {name} prompts.jsonl line {number}: {exc}") from None
    config_text = example_file(name, "config.yaml")
    digest = write_prompts(directory / "prompts.parquet", rows)
    atomic_write_text(directory / "config.yaml", config_text)
    return {
        "example": name,
        "directory": str(directory),
        "files": list(FILES),
        "rows": len(rows),
        "data_sha256": digest,
    }
