"""The vLLM rollout backend's CPU-side parts (issue #32): one adapter per policy version, and the
engine driven through :class:`FakeVllmLLM`, a named fake of the ``vllm.LLM`` surface the engine uses (vllm cannot
be installed here; the fake never writes harness evidence)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from miniverl.errors import UsageError
from miniverl.rollout.vllm_engine import (
    SLEEP_SECONDS,
    WAKE_SECONDS,
    AdapterVersions,
    SampledRow,
    VllmEngine,
    VllmRolloutError,
)

EOS = 2


def _save(path: Path) -> None:
    (path / "adapter_config.json").write_text("{}")


def test_each_policy_version_gets_its_own_adapter_and_a_new_lora_id(tmp_path: Path) -> None:
    saved: list[Path] = []

    def save(path: Path) -> None:
        saved.append(path)
        _save(path)

    adapters = AdapterVersions(tmp_path)
    first = adapters.slot(0, save)
    assert adapters.slot(0, save) is first and len(saved) == 1  # the same version is not saved twice
    second = adapters.slot(3, save)
    assert (first.lora_id, second.lora_id) == (1, 2) and second.path == tmp_path / "policy-v3"
    assert saved == [tmp_path / "policy-v0", tmp_path / "policy-v3"]
    with pytest.raises(UsageError, match="policy version 1 after version 3"):
        adapters.slot(1, save)
    with pytest.raises(VllmRolloutError, match="adapter of policy version 4 was not saved"):
        adapters.slot(4, lambda path: None)


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str


@dataclass
class RequestOutput:
    outputs: list[Completion]


@dataclass
class FakeVllmLLM:
    """A named fake of ``vllm.LLM`` (generate, sleep, wake_up): each request's tokens are its seed's, 4 and 5,
    then the request's first stop token (its EOS) when its seed is even; each token's log-prob is ``logprob``.
    It records what it was asked."""

    logprob: float = -1.5
    events: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    short_by: int = 0

    def generate(self, prompts: Any, sampling_params: Any = None, *, lora_request: Any = None) -> list[Any]:
        self.events.append("generate")
        self.requests.append(lora_request)
        outs = []
        for params in sampling_params[: len(prompts) - self.short_by]:
            eos = params["stop_token_ids"][0]
            tokens = [params["seed"] % 50 + 10, 4, 5] + ([eos] if params["seed"] % 2 == 0 else [])
            tokens = tokens[: params["max_tokens"]]
            finish = "stop" if tokens[-1] == eos else "length"
            outs.append(RequestOutput([Completion(tokens, [{t: Logprob(self.logprob)} for t in tokens], finish)]))
        return outs

    def sleep(self, level: int = 1) -> None:
        self.events.append(f"sleep{level}")

    def wake_up(self) -> None:
        self.events.append("wake")


def _engine(tmp_path: Path, llm: FakeVllmLLM) -> VllmEngine:
    return VllmEngine(
        llm=llm,
        version="0.26.0",
        adapters=AdapterVersions(tmp_path),
        sampling_params=dict,
        lora_request=lambda name, lora_id, path: (name, lora_id, path),
        asleep=True,
    )


def _sample(engine: VllmEngine, version: int, seeds: list[int], max_new_tokens: int = 8) -> list[Any]:
    rows = [SampledRow([1, 7, 8], seed) for seed in seeds]
    return engine.sample(
        rows,
        policy_version=version,
        save_adapter=_save,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eos_ids=[EOS],
    )


def test_the_engine_wakes_samples_with_the_versions_adapter_and_sleeps(tmp_path: Path) -> None:
    llm = FakeVllmLLM()
    engine = _engine(tmp_path, llm)
    drawn = _sample(engine, 0, [2, 3])
    assert llm.events == ["wake", "generate", "sleep1"] and engine.asleep
    assert set(engine.switch_seconds) == {WAKE_SECONDS, SLEEP_SECONDS}
    assert [d.token_ids for d in drawn] == [[12, 4, 5, EOS], [13, 4, 5]]
    assert [d.finish for d in drawn] == ["eos", "length"] and drawn[0].logprobs == [-1.5] * 4
    _sample(engine, 1, [4])
    assert [r[:2] for r in llm.requests] == [("policy-v0", 1), ("policy-v1", 2)]  # a refresh is a new adapter


@pytest.mark.parametrize(
    ("fake", "message"),
    [
        (FakeVllmLLM(logprob=0.5), "no finite log-prob <= 0 for the sampled token"),
        (FakeVllmLLM(short_by=1), "1 outputs for 2 prompts"),
    ],
)
def test_the_engine_refuses_what_vllm_returns_wrong_and_still_sleeps(
    tmp_path: Path, fake: FakeVllmLLM, message: str
) -> None:
    engine = _engine(tmp_path, fake)
    with pytest.raises(VllmRolloutError, match=message):
        _sample(engine, 0, [2, 3])
    assert fake.events[-1] == "sleep1" and engine.asleep


# -- the student's base as a transformers folder for vLLM -------------------------------------------------------


def _tiny_student(tmp_path: Path, loaded_from: str) -> tuple[Any, Any]:
    """A tiny llama with a trainable LoRA, as the runtime builds it, whose config names ``loaded_from``."""
    from peft import LoraConfig, get_peft_model

    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

    tokenizer = make_tiny_tokenizer()
    base = make_tiny_llama(tokenizer, seed=0)
    base.config._name_or_path = loaded_from
    student = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), "student")
    for name, param in student.named_parameters():  # a trained adapter: B no longer zero
        if "lora_B" in name:
            param.data.fill_(0.5)
    return student, tokenizer


def test_a_student_loaded_from_gguf_is_written_once_as_a_bf16_transformers_folder(tmp_path: Path) -> None:
    """What vLLM loads: the base's own weights in bf16 (no LoRA tensor: each version travels as its adapter), the
    config naming the architecture and bf16, the tokenizer; a transformers load of it gives the base's logits."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from miniverl.rollout.vllm_engine import BASE_FOLDER, BASE_WEIGHTS, vllm_model_dir

    gguf = tmp_path / "gguf-cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    student, tokenizer = _tiny_student(tmp_path, str(gguf.parent))  # what a GGUF load leaves: no config.json there
    folder = vllm_model_dir(student, tokenizer, tmp_path / "scratch")
    assert folder == tmp_path / "scratch" / BASE_FOLDER
    assert not (tmp_path / "scratch" / f"{BASE_FOLDER}.partial").exists()
    config = json.loads((folder / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["architectures"] == ["LlamaForCausalLM"]
    assert "_name_or_path" not in config and "quantization_config" not in config
    base = student.get_base_model()
    with safe_open(str(folder / BASE_WEIGHTS), "pt") as f:
        names = set(f.keys())
        assert all(f.get_tensor(n).dtype == torch.bfloat16 for n in names)
    assert not any("lora" in n or "base_layer" in n for n in names)
    assert "model.layers.0.self_attn.q_proj.weight" in names and "lm_head.weight" not in names  # tied

    reloaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16, attn_implementation="eager")
    with student.disable_adapter():
        want = {k.replace(".base_layer.", "."): v for k, v in base.state_dict().items() if "lora_" not in k}
    got = reloaded.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor.to(torch.bfloat16)), name
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad(), student.disable_adapter():
        base_logits = base.to(torch.bfloat16)(ids).logits
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, base_logits, atol=1e-2)
    assert AutoTokenizer.from_pretrained(str(folder)).get_vocab() == tokenizer.get_vocab()


def test_a_student_loaded_from_a_transformers_folder_is_handed_over_as_it_is(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from miniverl.rollout.vllm_engine import vllm_model_dir

    student, tokenizer = _tiny_student(tmp_path, str(tiny_model_dir))
    assert vllm_model_dir(student, tokenizer, tmp_path / "scratch") == tiny_model_dir
    assert not (tmp_path / "scratch").exists()


def test_an_nf4_student_hands_vllm_its_dequantized_weights_never_its_folder(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """An NF4 student loaded from a transformers folder trains on the 4-bit numbers, not the folder's: vLLM gets a
    folder of those numbers dequantized (bitsandbytes on CPU), without the quantization config, and a model loaded
    from it computes the NF4 student's logits (bf16 rounding apart), not the folder's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from miniverl.rollout.vllm_engine import BASE_FOLDER, vllm_model_dir
    from tests.helpers.tiny import make_tiny_tokenizer

    pytest.importorskip("bitsandbytes")
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    nf4 = AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32, quantization_config=quant, device_map={"": "cpu"}
    )
    student = get_peft_model(nf4, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), "student")
    folder = vllm_model_dir(student, make_tiny_tokenizer(), tmp_path / "scratch")
    assert folder == tmp_path / "scratch" / BASE_FOLDER
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    handed = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    unquantized = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    ids = torch.tensor([[1, 5, 7, 9, 11]])
    with torch.no_grad(), student.disable_adapter():
        trained_on = student(ids).logits
    with torch.no_grad():
        ours = (handed(ids).logits - trained_on).abs().max().item()
        folders = (unquantized(ids).logits - trained_on).abs().max().item()
    assert ours < 0.2 * folders, (ours, folders)
