"""Prompt datasets (Parquet, pyarrow only; importing this never imports torch)."""

from miniverl.data.prompts import (
    COLUMNS,
    PromptRow,
    describe_dataset,
    load_prompts,
    parquet_bytes,
    validate_rows,
    write_prompts,
)
from miniverl.data.tasks import DEFAULT_REWARDS, TASKS, sample_dataset

__all__ = [
    "COLUMNS",
    "DEFAULT_REWARDS",
    "TASKS",
    "PromptRow",
    "describe_dataset",
    "load_prompts",
    "parquet_bytes",
    "sample_dataset",
    "validate_rows",
    "write_prompts",
]
