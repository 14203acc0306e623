"""Hub models pinned file by file (miniverl.models.pinned), fetched from a fake hub on 127.0.0.1 (HF_ENDPOINT).

The fake hub serves tiny random-weight Qwen3- and DistilBERT-shaped models built in the test's tmp dir; the pins
point at them with the sha256 of each file, as the shipped pins do for Qwen/Qwen3-0.6B and the DistilBERT SST-2
classifier. A wrong hash, an unknown revision and a hub answering from another commit are refused by name, and
leave nothing in the cache.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from miniverl.config.schema import ModelSpec, RewardModelSpec
from miniverl.errors import ModelSourceError
from miniverl.models import pinned
from miniverl.models.pinned import HubPin, fetch_pinned, hub_pins, pin_for, pinned_cache_dir
from tests.conftest import tiny_config
from tests.helpers.fake_hub import FakeHub, serve

QWEN_REPO, QWEN_COMMIT = "Qwen/Qwen3-0.6B", "a" * 40
BERT_REPO, BERT_COMMIT = "distilbert/distilbert-base-uncased-finetuned-sst-2-english", "b" * 40
WORDS = ["the", "answer", "is", "good", "bad", "12", "7", "sure", "here", "a", "short", "number"]


@pytest.fixture(scope="module")
def tiny_repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch
    from transformers import DistilBertConfig, DistilBertForSequenceClassification, DistilBertTokenizerFast

    from tests.helpers.tiny import make_tiny_qwen3, make_tiny_tokenizer, save_tiny_model_dir

    root = tmp_path_factory.mktemp("repos")
    tokenizer = make_tiny_tokenizer()
    qwen = save_tiny_model_dir(root / "qwen", make_tiny_qwen3(tokenizer, seed=0), tokenizer)
    bert = root / "bert"
    bert.mkdir()
    vocab = bert / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    bert_tokenizer = DistilBertTokenizerFast(vocab_file=str(vocab))
    config = DistilBertConfig(vocab_size=5 + len(WORDS), dim=32, n_layers=1, n_heads=2, hidden_dim=64, num_labels=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DistilBertForSequenceClassification(config)
    model.save_pretrained(bert)
    bert_tokenizer.save_pretrained(bert)
    return {"qwen": qwen, "bert": bert}


def _pin(name: str, repo: str, commit: str, files: dict[str, str], role: str, **changes: Any) -> HubPin:
    value = {
        "name": name,
        "repo_id": repo,
        "revision": commit,
        "role": role,
        "revision_source": "the test's fake hub",
        "files": {n: {"sha256": digest} for n, digest in files.items()},
        **changes,
    }
    return HubPin.model_validate(value)


@pytest.fixture()
def hub(
    tiny_repos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FakeHub, dict[str, HubPin]]]:
    fake = FakeHub()
    qwen_files = fake.add_dir(QWEN_REPO, QWEN_COMMIT, tiny_repos["qwen"])
    bert_files = fake.add_dir(BERT_REPO, BERT_COMMIT, tiny_repos["bert"])
    pins = {
        "qwen3-0.6b": _pin("qwen3-0.6b", QWEN_REPO, QWEN_COMMIT, qwen_files, "causal_lm"),
        "distilbert-sst2": _pin("distilbert-sst2", BERT_REPO, BERT_COMMIT, bert_files, "sequence_classifier"),
    }
    monkeypatch.setattr(pinned, "hub_pins", lambda: pins)
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with serve(fake):
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        yield fake, pins


def _cache_entries(tmp_path: Path) -> list[str]:
    hub_dir = tmp_path / "cache" / "hub"
    return sorted(p.relative_to(hub_dir).as_posix() for p in hub_dir.rglob("*")) if hub_dir.exists() else []


def test_shipped_pins_are_valid_and_pin_every_weight_file() -> None:
    pins = hub_pins.__wrapped__()  # type: ignore[attr-defined]  # the files, not a monkeypatched mapping
    assert set(pins) == {"qwen3-0.6b", "distilbert-sst2"}
    assert pins["qwen3-0.6b"].repo_id == "Qwen/Qwen3-0.6B"
    assert pins["qwen3-0.6b"].revision == "c1899de289a04d12100db370d81485cdf75e47ca"
    assert pins["distilbert-sst2"].revision == "ef2f51c8f6a09fb8c418d1ccbda386970ed2d53f"
    for pin in pins.values():
        assert "model.safetensors" in pin.files and pin.files["model.safetensors"].size is not None


def test_fetch_verifies_every_file_and_reuses_the_cache(hub: tuple[FakeHub, dict[str, HubPin]], tmp_path: Path):
    fake, pins = hub
    pin = pins["qwen3-0.6b"]
    directory = fetch_pinned(pin)
    assert directory == pinned_cache_dir(pin)
    for name, pinned_file in pin.files.items():
        assert pinned.sha256_file(directory / name) == pinned_file.sha256
    heads = [path for method, path in fake.requests if method == "HEAD"]
    assert all(f"/{QWEN_REPO}/resolve/{QWEN_COMMIT}/" in path for path in heads) and len(heads) == len(pin.files)
    before = len(fake.requests)
    assert fetch_pinned(pin) == directory
    assert len(fake.requests) == before  # verified from the cache: no request
    assert not any(".tmp-" in entry for entry in _cache_entries(tmp_path))


def test_a_wrong_file_hash_is_refused_by_name_and_nothing_is_cached(
    hub: tuple[FakeHub, dict[str, HubPin]], tmp_path: Path
) -> None:
    _, pins = hub
    good = pins["qwen3-0.6b"]
    files = {n: f.sha256 for n, f in good.files.items()}
    files["tokenizer.json"] = "0" * 64
    bad = _pin("qwen3-0.6b", QWEN_REPO, QWEN_COMMIT, files, "causal_lm")
    with pytest.raises(ModelSourceError, match=r"tokenizer\.json has sha256 [0-9a-f]{64}, the pin records 0{64}"):
        fetch_pinned(bad)
    assert _cache_entries(tmp_path) == ["qwen3-0.6b"]  # the parent only: no entry, no temp directory


def test_an_unknown_revision_is_refused_by_name(hub: tuple[FakeHub, dict[str, HubPin]], tmp_path: Path) -> None:
    _, pins = hub
    files = {n: f.sha256 for n, f in pins["qwen3-0.6b"].files.items()}
    other = "c" * 40
    with pytest.raises(ModelSourceError, match=f"revision {other} not found in {QWEN_REPO}"):
        fetch_pinned(_pin("qwen3-0.6b", QWEN_REPO, other, files, "causal_lm"))
    assert _cache_entries(tmp_path) == ["qwen3-0.6b"]


def test_a_hub_answering_from_another_commit_is_refused(hub: tuple[FakeHub, dict[str, HubPin]], tmp_path: Path):
    fake, pins = hub
    fake.answer_commit = "d" * 40
    with pytest.raises(ModelSourceError, match=f"from commit {'d' * 40}, not the pinned revision {QWEN_COMMIT}"):
        fetch_pinned(pins["qwen3-0.6b"])
    assert _cache_entries(tmp_path) == ["qwen3-0.6b"]


def test_a_cached_copy_edited_afterwards_is_fetched_again(hub: tuple[FakeHub, dict[str, HubPin]]) -> None:
    _, pins = hub
    directory = fetch_pinned(pins["distilbert-sst2"])
    (directory / "config.json").write_text("{}")
    assert pinned.cached_pinned(pins["distilbert-sst2"]) is None
    assert fetch_pinned(pins["distilbert-sst2"]) == directory
    assert pinned.cached_pinned(pins["distilbert-sst2"]) == directory


def test_offline_and_not_cached_is_refused(hub: tuple[FakeHub, dict[str, HubPin]], monkeypatch: pytest.MonkeyPatch):
    _, pins = hub
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelSourceError, match="not in the miniverl cache and HF_HUB_OFFLINE is set"):
        fetch_pinned(pins["qwen3-0.6b"])


def test_a_pinned_hub_spec_resolves_with_its_files_digest_and_runs_a_forward(hub) -> None:
    import torch

    from miniverl.models.loading import load_causal_lm
    from miniverl.models.sources import resolve

    _, pins = hub
    pin = pins["qwen3-0.6b"]
    spec = ModelSpec(source="hub", model_id=QWEN_REPO, revision=QWEN_COMMIT)
    assert pin_for(QWEN_REPO, QWEN_COMMIT) == pin
    resolved = resolve(spec)
    assert resolved.identity == {
        "source": "hub",
        "model_id": QWEN_REPO,
        "revision": QWEN_COMMIT,
        "files_sha256": pin.files_sha256(),
    }
    model, tokenizer = load_causal_lm(resolved, dtype="float32", device="cpu", attn_implementation="eager")
    assert model.config.model_type == "qwen3"
    ids = tokenizer("The answer is 12.", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == model.config.vocab_size and torch.isfinite(logits).all()


def test_a_pinned_distilbert_is_the_reward_role_and_scores(hub) -> None:
    from miniverl.rewards.reward_model import RewardModel

    _, pins = hub
    spec = RewardModelSpec(source="hub", model_id=BERT_REPO, revision=BERT_COMMIT, placement="offload")
    rm = RewardModel(spec, device="cpu", student_tokenizer=None)
    assert rm.identity["role"] == "sequence_classifier"
    assert rm.identity["files_sha256"] == pins["distilbert-sst2"].files_sha256()
    assert rm.model.config.model_type == "distilbert"
    texts = ["the answer is good", "the answer is bad", "here a short number 12", "sure"]
    scores = rm.scores(texts)
    assert len(scores) == 4 and len(set(scores)) > 1
    assert rm.scores(texts) == scores  # deterministic


def test_plan_names_the_pinned_models_and_plans_nf4(hub, cli: Callable[..., Any], prompts: Path, workdir: Path) -> None:
    _, pins = hub
    config = tiny_config(Path("unused"))
    config["models"]["student"] = {
        "source": "hub",
        "model_id": QWEN_REPO,
        "revision": QWEN_COMMIT,
        "quantization": "nf4",
        "lora": {"r": 4, "alpha": 8},
    }
    config["models"]["reward"] = {"source": "hub", "model_id": BERT_REPO, "revision": BERT_COMMIT}
    config["algorithm"]["rewards"].append({"name": "reward_model", "weight": 0.1})
    (workdir / "config.yaml").write_text(yaml.safe_dump(config))
    result = cli("plan", "config.yaml", "--out", "plan.json", "--quiet")
    assert result.code == 0, result.err
    plan = json.loads((workdir / "plan.json").read_text())
    assert plan["models"]["student"]["files_sha256"] == pins["qwen3-0.6b"].files_sha256()
    assert plan["models"]["reward"]["files_sha256"] == pins["distilbert-sst2"].files_sha256()
    assert plan["placement"]["quantization"] == "nf4" and plan["placement"]["estimated_weight_bytes"]


def test_models_fetch_takes_a_pin_name_and_refuses_a_bad_file_in_one_line(
    hub, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, pins = hub
    done = cli("models", "fetch", "distilbert-sst2", "--json")
    assert done.code == 0, done.err
    assert done.json()["identity"]["files_sha256"] == pins["distilbert-sst2"].files_sha256()
    bad_files = {n: f.sha256 for n, f in pins["qwen3-0.6b"].files.items()} | {"config.json": "1" * 64}
    monkeypatch.setitem(pins, "qwen3-0.6b", _pin("qwen3-0.6b", QWEN_REPO, QWEN_COMMIT, bad_files, "causal_lm"))
    refused = cli("models", "fetch", "qwen3-0.6b")
    assert refused.code != 0 and refused.err.count("\n") == 1 and "config.json has sha256" in refused.err
    assert "Traceback" not in refused.err
    assert not (pinned_cache_dir(pins["qwen3-0.6b"])).exists()
