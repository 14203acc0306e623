"""The dual_model runtime and the padded forward: roles, isolation of rows, batch equivalence, export."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.algorithms.logprobs import chunked_token_logprobs
from miniverl.config.schema import ModelsSection
from miniverl.gate.models import RandomModelLoader, write_random_adapter
from miniverl.runtime import SequenceRows, build_runtime
from miniverl.runtime.dual import DualModelRuntime

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny matmuls: threads cost more than they save


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    loader = RandomModelLoader("tiny")
    path = tmp_path_factory.mktemp("teacher-adapter")
    sha = write_random_adapter(loader.config, path, seed=7)
    return {"source": "local", "path": str(path), "sha256": sha}


def _models(adapter: dict[str, Any] | None = None, **extra: Any) -> ModelsSection:
    teacher: dict[str, Any] = {"source": "student"}
    if adapter is not None:
        teacher["adapter"] = adapter
    return ModelsSection.model_validate(
        {"student": {"source": "local", "path": "tiny", "lora": {"r": 4, "alpha": 8}}, "teacher": teacher, **extra}
    )


def _runtime(adapter: dict[str, Any] | None = None, **extra: Any) -> DualModelRuntime:
    rt = build_runtime(_models(adapter, **extra), device=CPU, loader=RandomModelLoader("tiny"))
    assert isinstance(rt, DualModelRuntime)
    with torch.no_grad():  # make the student differ from its base (LoRA starts with B = 0)
        gen = torch.Generator().manual_seed(3)
        for name, param in rt.named_trainable_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return rt


ROWS = SequenceRows(
    input_ids=((5, 6, 7, 8, 9, 10), (11, 12, 13), (14, 15, 16, 17, 18, 19, 20, 21, 22), (30, 31)),
    selected_positions=((2, 3, 4), (1,), (0, 4, 7), (0,)),
)


def _row0_loss_and_grad(rt: DualModelRuntime, rows: SequenceRows, batch: int | str) -> tuple[Any, ...]:
    for p in rt.trainable_parameters():
        p.grad = None
    with rt.use("student") as h:
        hidden = h.selected_hidden(rows, trajectory_batch_size=batch)  # type: ignore[arg-type]
        n0 = len(rows.selected_positions[0])
        targets = torch.tensor([rows.input_ids[0][p + 1] for p in rows.selected_positions[0]])
        logp, _ = chunked_token_logprobs(hidden[:n0], h.head_weight, targets, chunk_size=2)
        loss = -logp.mean()
        loss.backward()
    grads = torch.cat([p.grad.flatten() for p in rt.trainable_parameters()])
    return hidden[:n0].detach(), loss.detach(), grads


def test_only_student_lora_is_trainable_and_frozen_roles_have_no_grad() -> None:
    rt = _runtime()
    names = [n for n, _ in rt.named_trainable_parameters()]
    assert names and all("lora_" in n and ".student." in n for n in names)
    with rt.use("teacher") as teacher:
        hidden = teacher.selected_hidden(ROWS, trajectory_batch_size=2)
    assert not hidden.requires_grad
    with rt.use("student") as student:
        assert student.selected_hidden(ROWS, trajectory_batch_size=2).requires_grad
    rt.close()


@pytest.mark.parametrize("batch", [2, 4, "auto"])
def test_batched_hidden_loss_and_grad_match_sequential(batch: int | str) -> None:
    rt = _runtime()
    with rt.use("student") as h:
        seq = h.selected_hidden(ROWS, trajectory_batch_size=1)
        bat = h.selected_hidden(ROWS, trajectory_batch_size=batch)  # type: ignore[arg-type]
    assert seq.shape == (sum(ROWS.selected_counts), 64)
    torch.testing.assert_close(bat, seq, atol=1e-5, rtol=1e-5)
    _, l1, g1 = _row0_loss_and_grad(rt, ROWS, 1)
    _, l2, g2 = _row0_loss_and_grad(rt, ROWS, batch)
    torch.testing.assert_close(l2, l1, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(g2, g1, atol=1e-6, rtol=1e-5)


def _with_row(rows: SequenceRows, index: int, ids: tuple[int, ...], positions: tuple[int, ...]) -> SequenceRows:
    input_ids = list(rows.input_ids)
    selected = list(rows.selected_positions)
    input_ids[index], selected[index] = ids, positions
    return SequenceRows(input_ids=tuple(input_ids), selected_positions=tuple(selected))


def test_changing_another_rows_tokens_leaves_this_row_unchanged() -> None:
    """Row 0 and row 1 share one padded forward (batch of all rows); only row 1's tokens change."""
    rt = _runtime()
    h0, l0, g0 = _row0_loss_and_grad(rt, ROWS, 4)
    changed = _with_row(ROWS, 1, (90, 91, 92), (1,))
    h1, l1, g1 = _row0_loss_and_grad(rt, changed, 4)
    torch.testing.assert_close(h1, h0, atol=1e-6, rtol=0)
    torch.testing.assert_close(l1, l0, atol=1e-7, rtol=0)
    torch.testing.assert_close(g1, g0, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("other_length", [1, 4, 12, 30])
def test_changing_another_rows_length_and_padding_leaves_this_row_unchanged(other_length: int) -> None:
    """Row 3 shares row 0's forward; its length changes which row is padded and by how much."""
    rt = _runtime()
    alone = _row0_loss_and_grad(rt, SequenceRows(ROWS.input_ids[:1], ROWS.selected_positions[:1]), 1)
    pair = SequenceRows(
        input_ids=(ROWS.input_ids[0], tuple(range(40, 40 + other_length))), selected_positions=((2, 3, 4), (0,))
    )
    batched = _row0_loss_and_grad(rt, pair, 2)
    for a, b in zip(batched, alone, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)


def test_padding_never_reaches_the_output() -> None:
    """Selected positions are gathered from real tokens only: output size is the selected count."""
    rt = _runtime()
    with rt.use("student") as h:
        plan = h.plan(ROWS, 4)
        batches = list(h.iter_selected_hidden(ROWS, trajectory_batch_size=4))
    assert [list(pb.rows) for pb in batches] == plan
    assert sum(pb.padded_tokens for pb in batches) > 0
    assert sum(pb.hidden.shape[0] for pb in batches) == sum(ROWS.selected_counts)
    assert all(torch.isfinite(pb.hidden).all() for pb in batches)


def test_teacher_with_pinned_adapter_differs_from_student_base(adapter: dict[str, Any]) -> None:
    rt = build_runtime(_models(adapter), device=CPU, loader=RandomModelLoader("tiny"))
    with rt.use("teacher") as t:
        teacher = t.selected_hidden(ROWS, trajectory_batch_size=1)
    with rt.use("student") as s:
        student = s.selected_hidden(ROWS, trajectory_batch_size=1).detach()
    assert (teacher - student).abs().max() > 1e-3
    manifest = rt.role_manifest()
    assert manifest["roles"]["teacher"]["adapter"]["adapter_model_sha256"] == adapter["sha256"]
    assert adapter["path"] not in json.dumps(manifest)


def test_teacher_and_reference_of_one_spec_share_a_physical_model_but_stay_roles(adapter: dict[str, Any]) -> None:
    ref = {"source": "student", "adapter": adapter}
    rt = build_runtime(_models(adapter, reference=ref), device=CPU, loader=RandomModelLoader("tiny"))
    assert rt.has_role("teacher") and rt.has_role("reference")
    roles = rt.role_manifest()["roles"]
    assert roles["teacher"]["physical_model"] == roles["reference"]["physical_model"]
    with rt.use("teacher") as t, rt.use("reference") as r:
        assert t.name == "teacher" and r.name == "reference"


def test_unknown_role_and_pinned_sha_mismatch_are_refused(adapter: dict[str, Any]) -> None:
    rt = _runtime()
    with pytest.raises(KeyError), rt.use("reference"):
        pass
    from miniverl.errors import ModelSourceError

    with pytest.raises(ModelSourceError, match="sha256"):
        build_runtime(_models({**adapter, "sha256": "0" * 64}), device=CPU, loader=RandomModelLoader("tiny"))


def test_export_is_a_standard_peft_adapter_that_reloads(tmp_path: Path) -> None:
    from peft import PeftModel

    rt = _runtime()
    rt.save_student_adapter(str(tmp_path / "adapter"))
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    ids = torch.tensor([ROWS.input_ids[2]])
    with rt.generation_model() as model:
        assert not model.training
        expected = model(input_ids=ids).logits
    base = RandomModelLoader("tiny")(_models().student, _load_settings()).model
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    torch.testing.assert_close(reloaded(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def _load_settings() -> Any:
    from miniverl.runtime.loading import LoadSettings

    return LoadSettings(device=CPU, dtype=torch.float32)


@pytest.mark.parametrize("runtime", ["dual_model", "shared_backbone"])
def test_activation_checkpointing_leaves_loss_and_gradients_unchanged(runtime: str, tmp_path: Path) -> None:
    loader = RandomModelLoader("tiny")
    sha = write_random_adapter(loader.config, tmp_path / "a", seed=2)
    adapter = {"source": "local", "path": str(tmp_path / "a"), "sha256": sha}
    results = []
    for every in (0, 1):
        models = _models(adapter).model_copy(update={"runtime": runtime})
        rt = build_runtime(models, device=CPU, loader=loader, activation_checkpointing=every)
        from miniverl.gate.workload import set_student_init

        set_student_init(rt, seed=4)
        results.append(_row0_loss_and_grad(rt, ROWS, 2))  # type: ignore[arg-type]
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-6)


def test_fused_kernels_that_cannot_run_here_are_refused_in_one_line() -> None:
    """``train.fused_kernels``: liger-kernel never runs on a CPU (nor under triton's interpreter); the runtime
    refuses it by the config key's name, before any forward changes."""
    from miniverl.errors import DependencyError

    rt = _runtime()
    with pytest.raises(DependencyError, match=r"^train\.fused_kernels liger: .*CUDA only") as refused:
        rt.fuse_training_kernels("liger")
    assert "\n" not in str(refused.value)
    norms = [m for m in rt._student.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all("forward" not in vars(m) for m in norms)  # nothing was swapped in
