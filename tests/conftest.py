"""Shared fixtures: a tiny local model directory, a prompt dataset, config files, an in-process CLI."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer, save_tiny_model_dir

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_llama(tokenizer, seed=0)
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", model, tokenizer)


@pytest.fixture()
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    from miniverl.cli import main

    def run(*argv: str) -> CliResult:
        code = main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def tiny_config(model_dir: Path, *, algorithm: str = "grpo", **sections: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "run": {"name": "tiny", "seed": 0, "deterministic": True},
        "models": {
            "device": "cpu",
            "dtype": "float32",
            "student": {"source": "local", "path": str(model_dir), "lora": {"r": 4, "alpha": 8}},
        },
        "data": {"path": "prompts.parquet"},
        "rollout": {"prompts_per_cycle": 2, "samples_per_prompt": 2, "max_new_tokens": 6, "batch_size": 4},
        "algorithm": {
            "name": algorithm,
            "rewards": [{"name": "target_length", "weight": 1.0, "params": {"target_tokens": 3}}],
        },
        "train": {"cycles": 2, "learning_rate": 0.01, "trajectory_batch_size": 2},
    }
    if algorithm == "opd":
        config["models"]["teacher"] = {
            "source": "student",
            "privileged_context": {"column": "context", "template": "{context}\n\n{prompt}"},
        }
    for name, values in sections.items():
        config.setdefault(name, {}).update(values)
    return config


@pytest.fixture()
def write_config(workdir: Path) -> Callable[..., Path]:
    def write(config: dict[str, Any], name: str = "config.yaml") -> Path:
        path = workdir / name
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    return write


@pytest.fixture()
def prompts(workdir: Path) -> Path:
    from miniverl.data import sample_dataset

    sample_dataset("calculator", 8, 0, workdir / "prompts.parquet")
    return workdir / "prompts.parquet"


@pytest.fixture()
def one_torch_thread() -> Iterator[None]:
    """Run a test on one torch thread (timing-sensitive CPU tests on a shared 2-core machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
