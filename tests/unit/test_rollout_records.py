"""Trajectory records: validation, canonical JSONL round trip, clear errors on bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from miniverl.errors import DataError
from miniverl.rollout.records import TrajectoryRecord, read_trajectories_jsonl, write_trajectories_jsonl


def _record(**changes: object) -> TrajectoryRecord:
    fields: dict[str, object] = {
        "prompt_id": "calc-0-0",
        "group_id": "calc-0-0@v0",
        "sample_index": 0,
        "policy_version": 0,
        "seed": 12345,
        "prompt_token_ids": [3, 10, 11],
        "response_token_ids": [20, 21, 4],
        "sampled_logprobs": [-0.5, -1.25, -0.1],
        "finish_reason": "eos",
        "response_text": "hi 12",
    }
    fields.update(changes)
    return TrajectoryRecord(**fields)  # type: ignore[arg-type]


def test_round_trip_is_exact_and_canonical(tmp_path: Path) -> None:
    records = [
        _record(),
        _record(sample_index=1, sampled_logprobs=[-1 / 3, -2e-9, -0.0], finish_reason="length"),
        _record(sample_index=2, reward=0.75, reward_components={"target_length": 0.75}, advantage=-1.5),
    ]
    path = tmp_path / "trajectories.jsonl"
    assert write_trajectories_jsonl(path, records) == 3
    assert read_trajectories_jsonl(path) == records
    first = path.read_text().splitlines()[0]
    assert first.startswith('{"advantage":null,"finish_reason":"eos","group_id":"calc-0-0@v0"')
    data = path.read_bytes()
    write_trajectories_jsonl(path, read_trajectories_jsonl(path))
    assert path.read_bytes() == data


def test_record_validation() -> None:
    with pytest.raises(ValidationError, match="one per token"):
        _record(sampled_logprobs=[-0.5])
    with pytest.raises(ValidationError, match="extra"):
        _record(temperature=1.0)
    with pytest.raises(ValidationError, match="finish_reason"):
        _record(finish_reason="stop")
    with pytest.raises(ValidationError):
        _record(sampled_logprobs=[-0.5, float("nan"), -0.1])
    with pytest.raises(ValidationError, match="<= 0"):
        _record(sampled_logprobs=[-0.5, 0.5, -0.1])
    with pytest.raises(ValidationError):
        _record(prompt_token_ids=[])


def test_read_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    write_trajectories_jsonl(path, [_record()])
    good = path.read_text()
    path.write_text(good + "{not json\n")
    with pytest.raises(DataError, match=r"t\.jsonl line 2: malformed JSON"):
        read_trajectories_jsonl(path)
    path.write_text(good + good.replace('"finish_reason":', '"finish_reason":"eos","finish_reason":', 1))
    with pytest.raises(DataError, match=r"t\.jsonl line 2: .*duplicate key"):
        read_trajectories_jsonl(path)
    path.write_text(good + good.replace('"finish_reason":"eos"', '"finish_reason":"done"'))
    with pytest.raises(DataError, match="line 2: finish_reason: "):
        read_trajectories_jsonl(path)
    with pytest.raises(DataError, match="trajectory file not found"):
        read_trajectories_jsonl(tmp_path / "missing.jsonl")
