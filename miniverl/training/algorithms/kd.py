"""Offline KD: the ``algorithm.distill`` divergence to a teacher on oracle trajectories, one update per cycle.

Roles: student, teacher (online, or read from ``algorithm.offline.teacher_cache``). The oracle
trajectories are SFT's (:func:`~miniverl.training.algorithms.sft.oracle_trajectories`); the
teacher sees the same response after its own prompt (or the privileged one, as in OPD).

With ``teacher_cache``, :meth:`Kd.prepare` covers every dataset row once: it loads the cache when
it matches (rows, teacher identity, settings) and otherwise writes it from the teacher. A stale or
corrupt cache is refused with one line (delete it to rebuild). Each cycle then selects its rows'
targets from the cache instead of running the teacher.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from miniverl.config.schema import DistillSection
from miniverl.data import PromptRow
from miniverl.rollout.hf import Trajectory
from miniverl.runtime.objectives import ObjectiveSpec, TeacherTargets, accumulate_objective, score_teacher
from miniverl.runtime.teacher_cache import build_teacher_cache, load_teacher_cache, teacher_identity
from miniverl.training.algorithms.base import Algorithm, AlgorithmStep, CycleBatch
from miniverl.training.algorithms.opd import teacher_sequences
from miniverl.training.algorithms.sft import oracle_trajectories, student_rows
from miniverl.training.update import rows_of


def kd_objective(distill: DistillSection, *, chunk_size: int) -> ObjectiveSpec:
    """The objective offline KD optimizes for an ``algorithm.distill`` section (also the equivalence gate's)."""
    return ObjectiveSpec(
        kind="divergence",
        variant=distill.objective,
        divergence=distill.divergence,
        beta=distill.beta,
        temperature=distill.temperature,
        top_k=distill.top_k,
        chunk_size=chunk_size,
    )


class Kd(Algorithm):
    name = "kd"
    roles = ("teacher",)
    on_policy = False

    cache: TeacherTargets | None = None
    cache_index: dict[str, int] | None = None
    cache_reused: bool | None = None

    def objective(self) -> ObjectiveSpec:
        return kd_objective(self.config.algorithm.distill, chunk_size=self.config.train.logprob_chunk_size)

    def oracle_trajectories(self, prompts: Sequence[PromptRow], *, policy_version: int) -> list[Trajectory]:
        return oracle_trajectories(self.config, self.runtime.tokenizer, prompts, policy_version=policy_version)

    def prepare(self, rows: Sequence[PromptRow]) -> None:
        directory = self.config.algorithm.offline.teacher_cache
        if directory is None:
            return
        everything = CycleBatch(list(rows), self.oracle_trajectories(rows, policy_version=0), [])
        teacher_rows = rows_of(teacher_sequences(self.config, self.runtime.tokenizer, everything), teacher=True)
        objective = self.objective()
        if not Path(directory).exists():
            build_teacher_cache(
                self.runtime,
                teacher_rows,
                directory,
                objective=objective,
                trajectory_batch_size=self.config.train.trajectory_batch_size,
            )
            self.cache_reused = False
        else:
            self.cache_reused = True
        self.cache = load_teacher_cache(
            directory,
            teacher_rows,
            objective=objective,
            teacher_identity=teacher_identity(self.runtime),
            device=self.runtime.device,
        )
        self.cache_index = {row.prompt_id: i for i, row in enumerate(rows)}

    def update(self, batch: CycleBatch, *, step: int) -> AlgorithmStep:
        objective = self.objective()
        if self.cache is not None and self.cache_index is not None:
            targets = self.cache.select_rows([self.cache_index[t.prompt_id] for t in batch.trajectories])
        else:
            teacher_rows = rows_of(teacher_sequences(self.config, self.runtime.tokenizer, batch), teacher=True)
            targets = score_teacher(
                self.runtime, teacher_rows, objective, trajectory_batch_size=self.config.train.trajectory_batch_size
            )
        rows = student_rows(batch)
        result = accumulate_objective(
            self.runtime,
            rows,
            objective,
            trajectory_batch_size=self.config.train.trajectory_batch_size,
            targets=targets,
        )
        grad_norm, delta = self.actor.step()
        metrics = {"kd/divergence": result.loss}
        if self.cache_reused is not None:
            metrics["kd/teacher_cache_reused"] = float(self.cache_reused)
        return AlgorithmStep(
            loss=result.loss,
            kl=result.loss,
            tokens=sum(rows.selected_counts),
            grad_norm=grad_norm,
            adapter_delta_norm=delta,
            metrics=metrics,
        )
