"""The reward-model role: deterministic nonconstant scores, digest pins, offload, mixing with rule rewards."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from miniverl.config.schema import RewardModelSpec, RewardTerm
from miniverl.errors import ConfigError
from miniverl.rewards.reward_model import MixedReward, RewardModel, reward_model_identity
from tests.helpers.tiny import make_tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXTS = ["what is 2+2?\n4", "what is 2+2?\nfive", "hello", "a much longer response with many words in it " * 3]


def _rm(**fields: object) -> RewardModel:
    return RewardModel(RewardModelSpec(**fields), device="cpu", student_tokenizer=make_tiny_tokenizer())


def test_tiny_reward_model_is_deterministic_and_nonconstant() -> None:
    first = _rm(batch_size=3).scores(TEXTS)
    again = _rm(batch_size=3).scores(TEXTS)
    assert first == again  # bit for bit, fresh instance included
    assert len(set(first)) == len(TEXTS)
    other_seed = _rm(tiny={"seed": 1}).scores(TEXTS)
    assert other_seed != first


def test_placement_home() -> None:
    offload = _rm(placement="offload")
    assert offload.location == "cpu" and offload.home.type == "cpu"
    resident = _rm(placement="resident")
    resident.scores(TEXTS)
    assert resident.transfers == 0


def test_offload_counts_transfers_per_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    rm = _rm(placement="offload")
    moves: list[str] = []
    real_to = rm.model.to

    def spy(device: object) -> object:
        moves.append(str(device))
        return real_to("cpu")

    monkeypatch.setattr(rm.model, "to", spy)
    rm.home = torch.device("cpu")
    rm.device = torch.device("cuda:0")  # never touched: the spy keeps everything on the CPU
    monkeypatch.setattr(rm, "tokenizer", _CpuTokenizer(rm.tokenizer))
    scores = rm.scores(TEXTS[:2])
    assert moves == ["cuda:0", "cpu"] and rm.transfers == 2 and len(scores) == 2


@dataclass
class _CpuTokenizer:
    inner: object

    def __call__(self, *args: object, **kwargs: object) -> object:
        enc = self.inner(*args, **kwargs)  # type: ignore[operator]
        enc.to = lambda device: enc  # keep the batch on the CPU whatever device is asked for
        return enc


def test_local_directory_is_pinned_by_digest(tmp_path: Path) -> None:
    rm = _rm()
    directory = tmp_path / "rm"
    rm.model.save_pretrained(directory)
    rm.tokenizer.save_pretrained(directory)
    spec = RewardModelSpec(source="local", path=str(directory))
    identity, _ = reward_model_identity(spec)
    local = RewardModel(spec, device="cpu", student_tokenizer=None, expected_identity=identity)
    assert local.scores(TEXTS) == rm.scores(TEXTS)
    (directory / "config.json").write_text((directory / "config.json").read_text() + "\n")
    with pytest.raises(ConfigError, match="changed since"):
        RewardModel(spec, device="cpu", student_tokenizer=None, expected_identity=identity)
    with pytest.raises(ConfigError, match="label 3 is out of range"):
        RewardModel(spec.model_copy(update={"label": 3}), device="cpu", student_tokenizer=None)


@dataclass
class _Row:
    prompt_id: str
    prompt: str
    answer: str = "4"
    context: str = ""
    task: str = "calculator"


@dataclass
class _Traj:
    prompt_id: str
    response_text: str
    response_token_count: int = 3
    sample_index: int = 0


def test_mixed_reward_weights_rules_and_model() -> None:
    rm = _rm()
    terms = [RewardTerm(name="calculator_exact", weight=2.0), RewardTerm(name="reward_model", weight=0.5)]
    mixed = MixedReward(terms, rm)
    rows = [_Row("p0", "what is 2+2?")]
    trajs = [_Traj("p0", "The answer is 4"), _Traj("p0", "no idea")]
    scores = mixed.score_batch(rows, trajs)
    raw = rm.scores(["what is 2+2?\nThe answer is 4", "what is 2+2?\nno idea"])
    for score, r in zip(scores, raw, strict=True):
        assert score.components["reward_model"] == r
        assert score.total == pytest.approx(2.0 * score.components["calculator_exact"] + 0.5 * r, abs=0)
    with pytest.raises(ConfigError):
        MixedReward(terms, None)


def test_local_distilbert_classifier_with_its_own_tokenizer(tmp_path: Path) -> None:
    """The seed's reward role is a DistilBERT sequence classifier: a tiny one, built offline, loads and scores."""
    import torch
    from transformers import BertTokenizerFast, DistilBertConfig, DistilBertForSequenceClassification

    words = sorted({w for text in TEXTS for w in text.replace("\n", " ").replace("?", " ?").split()})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    config = DistilBertConfig(
        vocab_size=tokenizer.vocab_size, dim=32, n_layers=1, n_heads=2, hidden_dim=64, num_labels=1
    )
    torch.manual_seed(0)
    model = DistilBertForSequenceClassification(config)
    directory = tmp_path / "distilbert-rm"
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    spec = RewardModelSpec(source="local", path=str(directory), batch_size=2)
    identity, _ = reward_model_identity(spec)
    assert identity["source"] == "local" and len(identity["tree_sha256"]) == 64
    rm = RewardModel(spec, device="cpu", student_tokenizer=None, expected_identity=identity)
    first = rm.scores(TEXTS)
    assert first == RewardModel(spec, device="cpu", student_tokenizer=None).scores(TEXTS)
    assert len(set(first)) > 1
