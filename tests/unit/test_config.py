"""Config loading, overrides and validation: every mistake is one clear ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest

from miniverl.config.loader import apply_overrides, load_config, parse_override
from miniverl.errors import ConfigError

BASE = """
models:
  student: {source: builtin, model_id: smollm2-135m-instruct}
data: {path: prompts.parquet}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_overrides_apply_in_order_and_parse_yaml_scalars(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, BASE), ["train.cycles=3", "train.cycles=5", "rollout.temperature=0.5", "run.deterministic=true"]
    )
    assert config.train.cycles == 5
    assert config.rollout.temperature == 0.5
    assert config.run.deterministic is True


def test_override_creates_missing_sections() -> None:
    data = apply_overrides({}, ["memory.placement=swap"])
    assert data == {"memory": {"placement": "swap"}}


@pytest.mark.parametrize("bad", ["novalue", "=3", "a..b=1", "train.cycles"])
def test_malformed_override(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_override(bad)


def test_override_into_scalar_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a section"):
        load_config(write(tmp_path, BASE), ["data.path.x=1"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [\n", "malformed YAML"),
        ("- 1\n- 2\n", "mapping at the top level"),
        (BASE + "surprise: 1\n", "unknown key 'surprise'"),
        (BASE + "train: {cycles: many}\n", "train.cycles"),
        (BASE + "train: {gradient_accumulation_steps: 3}\n", "the trajectories of one GRPO mini-batch"),
        (BASE + "algorithm: {name: opd}\n", "needs models.teacher"),
        (BASE + "algorithm: {grpo: {kl_coef: 0.1}}\n", "needs models.reference"),
        (
            "models:\n  student: {source: hub, model_id: org/m, revision: main}\ndata: {path: x}\n",
            "mutable",
        ),
        ("models:\n  student: {source: builtin, model_id: gpt-5}\ndata: {path: x}\n", "builtin model_id"),
    ],
)
def test_bad_configs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_mutable_revision_allowed_with_explicit_flag(tmp_path: Path) -> None:
    text = "models:\n  student: {source: hub, model_id: o/m, revision: main, allow_mutable_revision: true}\n"
    config = load_config(write(tmp_path, text + "data: {path: x}\n"))
    assert config.models.student.revision == "main"


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.yaml")


SHARED = """
models:
  runtime: shared_backbone
  student: {source: builtin, model_id: smollm2-135m-instruct, quantization: nf4}
  teacher:
    source: builtin
    model_id: smollm2-135m-instruct
    quantization: nf4
    adapter: {source: local, path: t, sha256: "%s"}
data: {path: p}
algorithm: {name: opd}
""" % ("a" * 64)


def test_seed_shared_backbone_shape_validates(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SHARED))
    assert config.models.runtime == "shared_backbone"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("memory.placement=swap", "swap is refused for a quantized shared backbone"),
        ("models.teacher.quantization=none", "quantization must equal"),
        ("models.teacher.model_id=other", "builtin model_id|student's base"),
        ("models.teacher.adapter.sha256=null", "needs sha256"),
    ],
)
def test_shared_backbone_refusals(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, SHARED), [override])
