"""Objectives on the batching contract, checked against a float64 brute force from full logits;
and the offline-KD teacher cache (safetensors + checksummed JSON index, refused when stale)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.config.schema import ModelsSection
from miniverl.gate.models import RandomModelLoader, write_random_adapter
from miniverl.gate.workload import set_student_init, synthetic_workload
from miniverl.runtime import build_runtime
from miniverl.runtime.base import SequenceRows
from miniverl.runtime.objectives import ObjectiveSpec, TeacherTargets, accumulate_objective, score_teacher
from miniverl.runtime.teacher_cache import TeacherCacheError, load_teacher_cache, write_teacher_cache

CPU = torch.device("cpu")
TEACHER_ID = {"source": "test", "digest": "a" * 64}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    loader = RandomModelLoader("tiny")
    path = tmp_path_factory.mktemp("adapter")
    sha = write_random_adapter(loader.config, path, seed=5, scale=0.2)
    models = ModelsSection.model_validate(
        {
            "student": {"source": "local", "path": "tiny", "lora": {"r": 4}},
            "teacher": {"source": "student", "adapter": {"source": "local", "path": str(path), "sha256": sha}},
        }
    )
    runtime = build_runtime(models, device=CPU, loader=loader)
    set_student_init(runtime, seed=3, b_scale=0.05)
    work = synthetic_workload(128, trajectories=5, scale=0.08)
    return {"runtime": runtime, "rows": work.rows, "weights": work.token_weights, "models": models, "loader": loader}


def _full_logits(model: Any, rows: SequenceRows) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for ids, pos in zip(rows.input_ids, rows.selected_positions, strict=True):
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            out.append(logits[list(pos)].double())
    return out


def _brute_force(setup: dict[str, Any], objective: ObjectiveSpec, targets: TeacherTargets | None) -> float:
    rt, rows, weights = setup["runtime"], setup["rows"], setup["weights"]
    with rt.generation_model() as student_model:
        student = _full_logits(student_model, rows)
    teacher = _full_logits(rt._handles["teacher"].model, rows)
    tau, beta = objective.temperature, objective.beta
    total, offset = 0.0, 0
    for r, (zs, zt) in enumerate(zip(student, teacher, strict=True)):
        ls, lt = torch.log_softmax(zs / tau, -1), torch.log_softmax(zt / tau, -1)
        n = zs.shape[0]
        if objective.kind == "sft":
            nxt = torch.tensor([rows.input_ids[r][p + 1] for p in rows.selected_positions[r]])
            values = -torch.log_softmax(zs, -1).gather(1, nxt[:, None])[:, 0]
        else:
            if objective.target_kind == "topk":
                assert targets is not None and targets.topk_ids is not None
                ids = targets.topk_ids[offset : offset + n]
                s_top, t_top = ls.gather(1, ids), lt.gather(1, ids)
                if objective.kind == "forward_kl_topk":
                    t_hat = t_top - torch.logsumexp(t_top, -1, keepdim=True)
                    values = (t_hat.exp() * (t_hat - s_top)).sum(-1)
                    ls, lt = None, None
                else:
                    s_tail = torch.log1p(-s_top.exp().sum(-1, keepdim=True).clamp_max(1 - 1e-15))
                    t_tail = torch.log1p(-t_top.exp().sum(-1, keepdim=True).clamp_max(1 - 1e-15))
                    ls, lt = torch.cat([s_top, s_tail], 1), torch.cat([t_top, t_tail], 1)
            if ls is not None and lt is not None:
                ps, pt = ls.exp(), lt.exp()
                if objective.divergence == "forward_kl":
                    values = (pt * (lt - ls)).sum(-1)
                elif objective.divergence == "reverse_kl":
                    values = (ps * (ls - lt)).sum(-1)
                else:
                    lm = torch.log(beta * pt + (1 - beta) * ps)
                    values = beta * (pt * (lt - lm)).sum(-1) + (1 - beta) * (ps * (ls - lm)).sum(-1)
        w = torch.tensor(weights[r], dtype=torch.float64)
        total += float((w * values).sum() / w.sum())
        offset += n
    return total / len(rows.input_ids)


OBJECTIVES = [
    ObjectiveSpec(kind="sft", chunk_size=7),
    ObjectiveSpec(variant="exact", divergence="reverse_kl", temperature=1.0, chunk_size=7),
    ObjectiveSpec(variant="exact", divergence="forward_kl", temperature=2.0, chunk_size=7),
    ObjectiveSpec(variant="exact", divergence="jsd", beta=0.3, temperature=0.7, chunk_size=7),
    ObjectiveSpec(variant="topk_tail", divergence="reverse_kl", top_k=8, chunk_size=7),
    ObjectiveSpec(variant="topk_tail", divergence="forward_kl", top_k=8, temperature=2.0, chunk_size=7),
    ObjectiveSpec(variant="topk_tail", divergence="jsd", top_k=5, chunk_size=7),
    ObjectiveSpec(kind="forward_kl_topk", top_k=8, temperature=1.5, chunk_size=7),
]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: f"{o.kind}-{o.variant}-{o.divergence}")
def test_objective_matches_float64_brute_force_for_every_batching(
    setup: dict[str, Any], objective: ObjectiveSpec
) -> None:
    rt = setup["runtime"]
    targets = None if objective.kind == "sft" else score_teacher(rt, setup["rows"], objective, trajectory_batch_size=2)
    expected = _brute_force(setup, objective, targets)
    grads = []
    for batch in (1, 3, "auto"):
        for p in rt.trainable_parameters():
            p.grad = None
        result = accumulate_objective(
            rt, setup["rows"], objective, trajectory_batch_size=batch, targets=targets,  # type: ignore[arg-type]
            token_weights=setup["weights"],
        )  # fmt: skip
        assert math.isclose(result.loss, expected, rel_tol=1e-5, abs_tol=1e-6)
        grads.append(torch.cat([p.grad.flatten() for p in rt.trainable_parameters()]))
    assert grads[0].abs().max() > 0
    for g in grads[1:]:
        torch.testing.assert_close(g, grads[0], atol=1e-6, rtol=1e-4)


def test_zero_weight_rows_contribute_nothing(setup: dict[str, Any]) -> None:
    rt, rows = setup["runtime"], setup["rows"]
    objective = ObjectiveSpec(kind="sft")
    weights = [list(w) for w in setup["weights"]]
    base = accumulate_objective(rt, rows, objective, trajectory_batch_size=2, token_weights=weights).loss
    weights[0] = [0.0] * len(weights[0])
    zeroed = accumulate_objective(rt, rows, objective, trajectory_batch_size=2, token_weights=weights).loss
    only0 = SequenceRows(rows.input_ids[:1], rows.selected_positions[:1])
    row0 = accumulate_objective(rt, only0, objective, trajectory_batch_size=1, token_weights=[setup["weights"][0]])
    assert math.isclose(base, zeroed + row0.loss / len(rows.input_ids), rel_tol=1e-5)


@pytest.mark.parametrize("variant", ["exact", "topk_tail"])
def test_teacher_cache_round_trip_gives_identical_loss(setup: dict[str, Any], tmp_path: Path, variant: str) -> None:
    rt, rows = setup["runtime"], setup["rows"]
    objective = ObjectiveSpec(variant=variant, divergence="forward_kl", top_k=6)  # type: ignore[arg-type]
    online = score_teacher(rt, rows, objective, trajectory_batch_size=1)
    write_teacher_cache(
        tmp_path / "c", rows, online, objective=objective, teacher_identity=TEACHER_ID, rows_per_shard=2
    )
    names = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert all(n.endswith((".safetensors", ".json")) for n in names)
    assert len([n for n in names if n.startswith("shard-")]) == 3
    cached = load_teacher_cache(tmp_path / "c", rows, objective=objective, teacher_identity=TEACHER_ID)
    assert cached.digest() == online.digest()
    kw: dict[str, Any] = {"trajectory_batch_size": 2, "token_weights": setup["weights"]}
    a = accumulate_objective(rt, rows, objective, targets=online, **kw).loss
    b = accumulate_objective(rt, rows, objective, targets=cached, **kw).loss
    assert a == b


def test_teacher_cache_refuses_stale_and_corrupt(setup: dict[str, Any], tmp_path: Path) -> None:
    rt, rows = setup["runtime"], setup["rows"]
    objective = ObjectiveSpec(variant="topk_tail", top_k=6)
    targets = score_teacher(rt, rows, objective, trajectory_batch_size=1)
    root = tmp_path / "c"
    write_teacher_cache(root, rows, targets, objective=objective, teacher_identity=TEACHER_ID)
    with pytest.raises(TeacherCacheError, match="already exists"):
        write_teacher_cache(root, rows, targets, objective=objective, teacher_identity=TEACHER_ID)
    other_rows = SequenceRows(((1, 2, 3), *rows.input_ids[1:]), ((0,), *rows.selected_positions[1:]))
    cases = [
        (rows, objective, {"source": "test", "digest": "b" * 64}, "another teacher"),
        (other_rows, objective, TEACHER_ID, "other rows"),
        (rows, ObjectiveSpec(variant="topk_tail", top_k=7), TEACHER_ID, "settings"),
        (rows, ObjectiveSpec(variant="exact"), TEACHER_ID, "needs 'hidden'"),
    ]
    for r, o, ident, message in cases:
        with pytest.raises(TeacherCacheError, match=message):
            load_teacher_cache(root, r, objective=o, teacher_identity=ident)
    shard = root / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(TeacherCacheError, match="corrupt"):
        load_teacher_cache(root, rows, objective=objective, teacher_identity=TEACHER_ID)
    index = json.loads((root / "index.json").read_text())
    index["settings"]["top_k"] = 99
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(TeacherCacheError, match="checksum"):
        load_teacher_cache(root, rows, objective=objective, teacher_identity=TEACHER_ID)
    with pytest.raises(TeacherCacheError, match="no teacher cache"):
        load_teacher_cache(tmp_path / "missing", rows, objective=objective, teacher_identity=TEACHER_ID)


def test_a_cache_built_under_dual_is_valid_under_shared(setup: dict[str, Any], tmp_path: Path) -> None:
    from miniverl.runtime.teacher_cache import build_teacher_cache, teacher_identity

    objective = ObjectiveSpec(variant="topk_tail", top_k=4)
    build_teacher_cache(setup["runtime"], setup["rows"], tmp_path / "c", objective=objective)
    shared = build_runtime(
        setup["models"].model_copy(update={"runtime": "shared_backbone"}), device=CPU, loader=setup["loader"]
    )
    identity = teacher_identity(shared)
    assert identity == teacher_identity(setup["runtime"])
    assert str(tmp_path) not in json.dumps(identity)
    cached = load_teacher_cache(tmp_path / "c", setup["rows"], objective=objective, teacher_identity=identity)
    online = score_teacher(shared, setup["rows"], objective, trajectory_batch_size=1)
    assert cached.digest() == online.digest()
