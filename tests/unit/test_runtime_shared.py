"""The shared_backbone runtime: adapter-role switching, grad guards, restore, refusals, export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.config.schema import ModelsSection
from miniverl.errors import ConfigError
from miniverl.gate.models import RandomModelLoader, write_random_adapter
from miniverl.runtime import SequenceRows, build_runtime
from miniverl.runtime.shared import SharedBackboneRuntime, check_shared_models

CPU = torch.device("cpu")
ROWS = SequenceRows(
    input_ids=((5, 6, 7, 8, 9, 10), (11, 12, 13), (14, 15, 16, 17, 18, 19, 20, 21, 22)),
    selected_positions=((2, 3, 4), (1,), (0, 4, 7)),
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    config = RandomModelLoader("tiny").config
    out = {}
    for name, seed in (("teacher", 7), ("other", 8)):
        path = tmp_path_factory.mktemp(name)
        out[name] = {"source": "local", "path": str(path), "sha256": write_random_adapter(config, path, seed=seed)}
    return out


def _section(runtime: str, teacher: dict[str, Any] | None, reference: dict[str, Any] | None = None) -> ModelsSection:
    data: dict[str, Any] = {"runtime": runtime, "student": {"source": "local", "path": "tiny", "lora": {"r": 4}}}
    if teacher is not None:
        data["teacher"] = {"source": "student", "adapter": teacher}
    if reference is not None:
        data["reference"] = {"source": "student", "adapter": reference}
    return ModelsSection.model_validate(data)


def _shared(adapters: dict[str, dict[str, Any]], reference: str | None = None) -> SharedBackboneRuntime:
    ref = adapters[reference] if reference else None
    section = _section("shared_backbone", adapters["teacher"], ref)
    rt = build_runtime(section, device=CPU, loader=RandomModelLoader("tiny"))
    assert isinstance(rt, SharedBackboneRuntime)
    return rt


def _trainable(rt: SharedBackboneRuntime) -> list[str]:
    return [n for n, _ in rt.named_trainable_parameters()]


@pytest.mark.parametrize("fast_switch", [True, False])
def test_only_the_student_adapter_is_ever_trainable(adapters: dict[str, dict[str, Any]], fast_switch: bool) -> None:
    rt = _shared(adapters, reference="teacher")
    rt._fast_switch = fast_switch  # False: peft's set_adapter path, which flips requires_grad
    expected = _trainable(rt)
    assert expected and all(".student." in n for n in expected)
    for role in ("teacher", "reference", "student"):
        with rt.use(role) as handle:  # type: ignore[arg-type]
            assert _trainable(rt) == expected  # peft's set_adapter would flip these; the guard undoes it
            hidden = handle.selected_hidden(ROWS, trajectory_batch_size=2)
            assert hidden.requires_grad == (role == "student")
        assert _trainable(rt) == expected


def test_switch_restores_previous_role_after_success_and_after_an_exception(
    adapters: dict[str, dict[str, Any]],
) -> None:
    rt = _shared(adapters)
    with rt.use("student") as s:
        before = s.selected_hidden(ROWS, trajectory_batch_size=1).detach()
    with rt.use("teacher"):
        assert rt.active_role == "teacher"
        assert not rt._model.training
    assert rt.active_role == "student" and rt._model.training
    with pytest.raises(RuntimeError, match="boom"), rt.use("teacher"):
        raise RuntimeError("boom")
    assert rt.active_role == "student"
    assert all(layer.active_adapters == ["student"] for layer in rt._layers)
    with rt.use("student") as s:
        assert torch.equal(s.selected_hidden(ROWS, trajectory_batch_size=1).detach(), before)


def test_nested_use_of_the_active_role_is_a_no_op(adapters: dict[str, dict[str, Any]]) -> None:
    rt = _shared(adapters)
    with rt.use("student"), rt.use("student"):
        assert rt.switch_count == 0
    with rt.use("teacher"):
        count = rt.switch_count
        with rt.use("teacher"):
            assert rt.switch_count == count
        with rt.use("student"):
            assert rt.active_role == "student"
        assert rt.active_role == "teacher"
    assert rt.active_role == "student"


def test_teacher_and_reference_are_distinct_roles_even_for_one_artifact(adapters: dict[str, dict[str, Any]]) -> None:
    rt = _shared(adapters, reference="teacher")
    roles = rt.role_manifest()["roles"]
    assert roles["teacher"]["adapter_name"] == "teacher" and roles["reference"]["adapter_name"] == "reference"
    assert roles["teacher"]["adapter"] == roles["reference"]["adapter"]
    with rt.use("teacher") as t:
        teacher = t.selected_hidden(ROWS, trajectory_batch_size=1)
    with rt.use("reference") as r:
        reference = r.selected_hidden(ROWS, trajectory_batch_size=1)
    assert torch.equal(teacher, reference)
    rt2 = _shared(adapters, reference="other")
    with rt2.use("reference") as r:
        assert not torch.equal(r.selected_hidden(ROWS, trajectory_batch_size=1), teacher)


def test_shared_roles_match_dual_roles_exactly(adapters: dict[str, dict[str, Any]]) -> None:
    shared = _shared(adapters)
    dual = build_runtime(_section("dual_model", adapters["teacher"]), device=CPU, loader=RandomModelLoader("tiny"))
    for role in ("student", "teacher"):
        with shared.use(role) as a, dual.use(role) as b:  # type: ignore[arg-type]
            for batch in (1, 2, "auto"):
                ha = a.selected_hidden(ROWS, trajectory_batch_size=batch)  # type: ignore[arg-type]
                hb = b.selected_hidden(ROWS, trajectory_batch_size=batch)  # type: ignore[arg-type]
                assert torch.equal(ha, hb)


def test_manifest_records_roles_and_digests_without_paths(adapters: dict[str, dict[str, Any]]) -> None:
    rt = _shared(adapters)
    manifest = rt.role_manifest()
    assert manifest["runtime"] == "shared_backbone"
    assert manifest["roles"]["teacher"]["adapter"]["adapter_model_sha256"] == adapters["teacher"]["sha256"]
    assert adapters["teacher"]["path"] not in json.dumps(manifest)


def test_export_is_the_student_adapter_only_and_reloads(adapters: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    rt = _shared(adapters)
    with torch.no_grad():
        for name, p in rt.named_trainable_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    rt.save_student_adapter(str(tmp_path / "out"))
    keys = list(load_file(str(tmp_path / "out" / "adapter_model.safetensors")))
    assert keys and not any("teacher" in k or "student" in k for k in keys)
    ids = torch.tensor([ROWS.input_ids[0]])
    with rt.use("teacher"), rt.generation_model() as model:
        assert rt.active_role == "student" and not model.training
        expected = model(input_ids=ids).logits
    assert rt.active_role == "student"
    from miniverl.runtime.loading import LoadSettings

    base = RandomModelLoader("tiny")(_section("dual_model", None).student, LoadSettings(CPU, torch.float32)).model
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "out"))
    torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_refusals(adapters: dict[str, dict[str, Any]]) -> None:
    # a teacher is OPD's role, not the runtime's: GRPO/PPO run a shared backbone without one
    # (the config refuses opd without models.teacher; the algorithm checks the runtime's roles)
    check_shared_models(_section("shared_backbone", None), "resident")
    no_adapter = ModelsSection.model_validate(
        {"runtime": "shared_backbone", "student": {"source": "local", "path": "tiny"}, "teacher": {"source": "student"}}
    )
    with pytest.raises(ConfigError, match="pinned adapter"):
        check_shared_models(no_adapter, "resident")
    nf4 = ModelsSection.model_validate(
        {
            "runtime": "shared_backbone",
            "student": {"source": "local", "path": "tiny", "quantization": "nf4"},
            "teacher": {"source": "student", "quantization": "nf4", "adapter": adapters["teacher"]},
        }
    )
    check_shared_models(nf4, "resident")
    with pytest.raises(ConfigError, match="swap is refused"):
        check_shared_models(nf4, "swap")
    other_base = _section("shared_backbone", adapters["teacher"]).model_copy()
    other_base.teacher = other_base.teacher.model_copy(update={"source": "local", "path": "elsewhere"})  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="student's base"):
        check_shared_models(other_base, "resident")
