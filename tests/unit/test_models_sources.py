"""Model sources and identities, torch-free: local dirs, a fake offline hub cache, GGUF, builtin pins."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from miniverl.canonical import canonical_json, sha256_bytes, sha256_json
from miniverl.config.schema import AdapterSpec, ModelSpec
from miniverl.errors import ModelSourceError
from miniverl.models.builtin import SMOLLM2_135M_INSTRUCT
from miniverl.models.sources import (
    adapter_identity,
    describe_architecture,
    estimate_param_count,
    model_identity,
    plan_architecture,
    plan_identity,
    resolve,
)

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"

LLAMA_CONFIG = {
    "model_type": "llama",
    "vocab_size": 400,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "tie_word_embeddings": True,
}


def fake_model_dir(root: Path, *, weights: bytes = b"weights-v1") -> Path:
    """A model directory as far as resolution is concerned: no weights are ever parsed."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (root / "model.safetensors").write_bytes(weights)
    (root / "tokenizer.json").write_text("{}")
    return root


def fake_hub_cache(cache: Path, repo_id: str, commit: str, *, ref: str | None = "main") -> Path:
    """The huggingface_hub cache layout: models--org--name/{snapshots/<commit>/..., refs/<ref>}."""
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = fake_model_dir(repo_dir / "snapshots" / commit)
    if ref is not None:
        (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
        (repo_dir / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture()
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub_cache(cache, "org/tiny", COMMIT)
    return cache


def test_sources_and_builtin_plan_identity_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import miniverl.models, miniverl.models.sources, miniverl.models.builtin\n"
        "import miniverl.models.cache, miniverl.models.gguf, miniverl.models.loading\n"
        "from miniverl.config.schema import ModelSpec\n"
        "from miniverl.models.sources import plan_identity, plan_architecture\n"
        "spec = ModelSpec(source='builtin', model_id='smollm2-135m-instruct')\n"
        "assert plan_identity(spec)['source'] == 'builtin'\n"
        "assert plan_architecture(spec)['hidden_size'] == 576\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'bitsandbytes') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------------ local


def test_local_identity_is_content_only_and_path_independent(tmp_path: Path) -> None:
    first = fake_model_dir(tmp_path / "a" / "model")
    (first / ".cache").mkdir()
    (first / ".cache" / "download.lock").write_text("machine-local noise")
    second = tmp_path / "elsewhere" / "copy"
    shutil.copytree(first, second)
    (second / ".cache" / "download.lock").write_text("different noise")

    one = resolve(ModelSpec(source="local", path=str(first)))
    two = resolve(ModelSpec(source="local", path=str(second)))
    assert one.identity == two.identity
    assert one.identity["source"] == "local"
    assert set(one.identity["files"]) == {"config.json", "model.safetensors", "tokenizer.json"}
    assert one.identity["files"]["model.safetensors"] == sha256_bytes(b"weights-v1")
    assert one.identity["tree_sha256"] == sha256_json(one.identity["files"])
    assert str(tmp_path) not in canonical_json(one.identity)
    assert one.path == first

    (second / "model.safetensors").write_bytes(b"weights-v2")
    changed = resolve(ModelSpec(source="local", path=str(second)))
    assert changed.identity["tree_sha256"] != one.identity["tree_sha256"]


def test_missing_local_model_names_the_path_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError, match=r"^model directory not found: models/nope$"):
        resolve(ModelSpec(source="local", path="models/nope"))


def test_local_dir_needs_config_and_safetensors(tmp_path: Path) -> None:
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match=r"has no config\.json"):
        resolve(ModelSpec(source="local", path=str(no_config)))
    pickle_only = tmp_path / "pickle"
    pickle_only.mkdir()
    (pickle_only / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (pickle_only / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ModelSourceError, match="only pickle weights"):
        resolve(ModelSpec(source="local", path=str(pickle_only)))


# -------------------------------------------------------------------------------------------------- hub


def test_hub_offline_resolves_from_the_local_cache(offline_hub: Path) -> None:
    spec = ModelSpec(source="hub", model_id="org/tiny", revision=COMMIT)
    resolved = resolve(spec)
    assert resolved.path == offline_hub / "models--org--tiny" / "snapshots" / COMMIT
    assert resolved.identity == {"source": "hub", "model_id": "org/tiny", "revision": COMMIT}
    assert model_identity(spec, resolved) == resolved.identity
    # plan time: identity and architecture without fetching weights
    planned = resolve(spec, fetch=False)
    assert planned.path is None and planned.identity == resolved.identity
    assert describe_architecture(planned)["hidden_size"] == 64


def test_hub_offline_miss_is_a_clear_error(offline_hub: Path) -> None:
    spec = ModelSpec(source="hub", model_id="org/absent", revision=OTHER_COMMIT)
    message = f"model org/absent@{OTHER_COMMIT} not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
    with pytest.raises(ModelSourceError, match=message):
        resolve(spec)
    with pytest.raises(ModelSourceError, match="not in the local Hugging Face cache"):
        resolve(ModelSpec(source="hub", model_id="org/tiny", revision=OTHER_COMMIT), fetch=False)


def test_hub_snapshot_without_weights_is_refused(offline_hub: Path) -> None:
    snapshot = offline_hub / "models--org--tiny" / "snapshots" / COMMIT
    (snapshot / "model.safetensors").unlink()
    with pytest.raises(ModelSourceError, match=r"model org/tiny@.* has no \*\.safetensors weights"):
        resolve(ModelSpec(source="hub", model_id="org/tiny", revision=COMMIT))


def test_mutable_revision_refused_by_the_schema() -> None:
    with pytest.raises(ValidationError, match="mutable"):
        ModelSpec(source="hub", model_id="org/tiny", revision="main")


def test_mutable_revision_allowed_resolves_to_the_commit(offline_hub: Path) -> None:
    spec = ModelSpec(source="hub", model_id="org/tiny", revision="main", allow_mutable_revision=True)
    assert resolve(spec).identity["revision"] == COMMIT
    assert plan_identity(spec)["revision"] == COMMIT
    unknown = ModelSpec(source="hub", model_id="org/tiny", revision="dev", allow_mutable_revision=True)
    with pytest.raises(ModelSourceError, match="org/tiny@dev not in the local Hugging Face cache"):
        resolve(unknown)


# ---------------------------------------------------------------------------------------- gguf, builtin


def test_gguf_identity_is_its_sha256(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF-not-really")
    resolved = resolve(ModelSpec(source="gguf", path=str(path)))
    assert resolved.identity == {"source": "gguf", "sha256": sha256_bytes(b"GGUF-not-really")}
    with pytest.raises(ModelSourceError, match=r"^GGUF file not found: nope\.gguf$"):
        resolve(ModelSpec(source="gguf", path="nope.gguf"))


def test_builtin_plan_identity_uses_pins_without_fetching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIVERL_CACHE", str(tmp_path / "cache"))
    spec = ModelSpec(source="builtin", model_id="smollm2-135m-instruct")
    resolved = resolve(spec, fetch=False)
    pin = SMOLLM2_135M_INSTRUCT
    assert resolved.identity == {
        "source": "builtin",
        "name": "smollm2-135m-instruct",
        "wheel_sha256": pin.wheel_sha256,
        "gguf_sha256": pin.gguf_sha256,
    }
    assert resolved.path is None
    arch = plan_architecture(spec)
    assert arch is not None and arch["param_count"] == 134_515_008  # the real model's parameter count
    assert not (tmp_path / "cache").exists()


def test_student_source_resolves_to_the_student(tmp_path: Path) -> None:
    student = ModelSpec(source="local", path=str(fake_model_dir(tmp_path / "student")))
    teacher = ModelSpec(source="student")
    assert plan_identity(teacher, student=student) == plan_identity(student)
    with pytest.raises(ModelSourceError, match="needs the student"):
        resolve(teacher)


def test_adapter_pins_enter_the_identity(tmp_path: Path) -> None:
    adapter_dir = tmp_path / "adapter"
    adapter_dir.mkdir()
    (adapter_dir / "adapter_config.json").write_text("{}")
    (adapter_dir / "adapter_model.safetensors").write_bytes(b"lora")
    digest = sha256_bytes(b"lora")
    student = ModelSpec(source="local", path=str(fake_model_dir(tmp_path / "student")))
    teacher = ModelSpec(source="student", adapter=AdapterSpec(source="local", path=str(adapter_dir), sha256=digest))
    identity = plan_identity(teacher, student=student)
    assert identity["adapter"] == {"source": "local", "sha256": digest}
    assert str(tmp_path) not in canonical_json(identity)
    wrong = AdapterSpec(source="local", path=str(adapter_dir), sha256="0" * 64)
    with pytest.raises(ModelSourceError, match=r"adapter_model\.safetensors has sha256"):
        adapter_identity(wrong)
    hub = AdapterSpec(source="hub", path="org/lora", revision=COMMIT)
    assert adapter_identity(hub) == {"source": "hub", "repo_id": "org/lora", "revision": COMMIT}


def test_param_count_estimate_matches_a_known_model() -> None:
    # Qwen3-0.6B's architecture (tied embeddings); its model card: 0.6B parameters, 0.44B non-embedding.
    qwen3 = {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "tie_word_embeddings": True,
    }
    total = estimate_param_count(qwen3, qk_norm=True)
    assert total == 596_049_920
    assert round((total - 151936 * 1024) / 1e9, 2) == 0.44
