"""SFT: cross-entropy on oracle trajectories (a dataset column after the prompt), one update per cycle.

Roles: student only. No rollout: each cycle takes ``rollout.prompts_per_cycle`` dataset rows and
:func:`oracle_trajectories` builds prompt + ``algorithm.offline.target_column`` (+ EOS). The loss
is each trajectory's mean token NLL, averaged over the trajectories
(:func:`~miniverl.runtime.objectives.accumulate_objective`, the shared batching contract).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miniverl.config.schema import MiniverlConfig
from miniverl.data import PromptRow
from miniverl.errors import DataError
from miniverl.rollout.hf import Trajectory
from miniverl.runtime.base import SequenceRows
from miniverl.runtime.objectives import ObjectiveSpec, accumulate_objective
from miniverl.training.algorithms.base import Algorithm, AlgorithmStep, CycleBatch
from miniverl.training.update import rows_of


def oracle_trajectories(
    config: MiniverlConfig, tokenizer: Any, prompts: Sequence[PromptRow], *, policy_version: int
) -> list[Trajectory]:
    """Prompt (rendered as for rollout) + the row's target text (+ EOS): one trajectory per row.

    Nothing is sampled: ``seed`` is 0 and ``sampled_logprobs`` are 0 (each token comes from the
    dataset's point mass), so the records keep the rollout format.
    """
    from miniverl.rollout.hf import encode_prompt, group_id_for

    offline = config.algorithm.offline
    eos = tokenizer.eos_token_id
    out = []
    for row in prompts:
        target = getattr(row, offline.target_column)
        ids = [int(i) for i in tokenizer(target, add_special_tokens=False)["input_ids"]]
        if offline.append_eos and eos is not None:
            ids.append(int(eos))
        if not ids:
            raise DataError(
                f"row {row.prompt_id}: column {offline.target_column!r} is empty; "
                f"{config.algorithm.name} needs a target text in every row"
            )
        out.append(
            Trajectory(
                prompt_id=row.prompt_id,
                sample_index=0,
                group_id=group_id_for(row.prompt_id, policy_version),
                policy_version=policy_version,
                seed=0,
                prompt_token_ids=tuple(
                    encode_prompt(tokenizer, row.prompt, use_chat_template=config.rollout.use_chat_template)
                ),
                response_token_ids=tuple(ids),
                sampled_logprobs=(0.0,) * len(ids),  # drawn from the dataset's point mass: log 1
                finish_reason="eos" if offline.append_eos and eos is not None else "length",
                prompt_text=row.prompt,
                response_text=target,
            )
        )
    return out


def student_rows(batch: CycleBatch) -> SequenceRows:
    return rows_of(batch.sequences(), teacher=False)


def sft_objective(*, chunk_size: int) -> ObjectiveSpec:
    """The objective SFT optimizes (also the equivalence gate's)."""
    return ObjectiveSpec(kind="sft", chunk_size=chunk_size)


class Sft(Algorithm):
    name = "sft"
    on_policy = False

    def oracle_trajectories(self, prompts: Sequence[PromptRow], *, policy_version: int) -> list[Trajectory]:
        return oracle_trajectories(self.config, self.runtime.tokenizer, prompts, policy_version=policy_version)

    def update(self, batch: CycleBatch, *, step: int) -> AlgorithmStep:
        rows = student_rows(batch)
        objective = sft_objective(chunk_size=self.config.train.logprob_chunk_size)
        result = accumulate_objective(
            self.runtime, rows, objective, trajectory_batch_size=self.config.train.trajectory_batch_size
        )
        grad_norm, delta = self.actor.step()
        return AlgorithmStep(
            loss=result.loss,
            kl=None,
            tokens=sum(rows.selected_counts),
            grad_norm=grad_norm,
            adapter_delta_norm=delta,
            metrics={"sft/nll": result.loss, "sft/padding_tokens": float(result.padding_tokens)},
        )
