"""The training controller: cycles of rollout -> score -> update, checkpoints, metrics. Thin by design."""

from __future__ import annotations

import math
import random
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from miniverl import progress
from miniverl.algorithms import grpo_advantages
from miniverl.canonical import atomic_write_text, canonical_json
from miniverl.config.schema import MiniverlConfig
from miniverl.data import PromptRow
from miniverl.errors import CheckpointError
from miniverl.records import MetricsLine, PlanRecord
from miniverl.rewards import CompositeReward, RewardScore, reward_meta
from miniverl.rollout.hf import Trajectory
from miniverl.rollout.records import TrajectoryRecord, write_trajectories_jsonl
from miniverl.runtime.base import RoleRuntime
from miniverl.training import checkpoint as ckpt
from miniverl.training.checkpoint_files import list_checkpoints
from miniverl.training.update import UpdateSequence, UpdateStats, grpo_update, opd_update


@dataclass
class Progress:
    """Counters that a checkpoint carries across an interruption."""

    step: int = 0
    data_cursor: int = 0
    metrics: list[MetricsLine] = field(default_factory=list)


def prompt_order(rows: Sequence[PromptRow], *, shuffle: bool, seed: int) -> list[int]:
    order = list(range(len(rows)))
    if shuffle:
        random.Random(seed).shuffle(order)
    return order


def cycle_prompts(rows: Sequence[PromptRow], order: list[int], cursor: int, count: int) -> list[PromptRow]:
    return [rows[order[(cursor + i) % len(order)]] for i in range(count)]


class Controller:
    def __init__(
        self,
        config: MiniverlConfig,
        plan: PlanRecord,
        runtime: RoleRuntime,
        rows: Sequence[PromptRow],
        run_dir: Path,
        *,
        on_update: Callable[[int], None] | None = None,
        progress: Callable[[int, int, MetricsLine], None] | None = None,
    ) -> None:
        self.config = config
        self.plan = plan
        self.runtime = runtime
        self.rows = list(rows)
        self.run_dir = run_dir
        self.on_update = on_update
        self.progress = progress
        self.order = prompt_order(self.rows, shuffle=config.data.shuffle, seed=config.run.seed)
        self.reward = CompositeReward([(t.name, t.weight, t.params) for t in config.algorithm.rewards])
        train = config.train
        self.optimizer = torch.optim.AdamW(
            runtime.trainable_parameters(),
            lr=train.learning_rate,
            betas=train.adam_betas,
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
        )
        self.state = Progress()

    # -- checkpoint I/O ---------------------------------------------------------------------
    def restore(self, directory: Path, record: Any) -> None:
        params, opt_tensors, state = ckpt.read_checkpoint(directory)
        named = dict(self.runtime.named_trainable_parameters())
        if set(named) != set(params):
            raise CheckpointError(f"checkpoint {directory.name} does not match this plan's adapter")
        with torch.no_grad():
            for name, tensor in params.items():
                named[name].copy_(tensor.to(named[name].device, named[name].dtype))
        ckpt.optimizer_from_tensors(self.optimizer, opt_tensors, state["optimizer"])
        ckpt.restore_rng_from(directory, state)
        extra = state["extra"]
        self.state = Progress(step=record.step, data_cursor=record.data_cursor)
        self.state.metrics = [MetricsLine.model_validate(m) for m in extra["metrics"]]

    def _checkpoint(self) -> None:
        if self.state.step % self.config.checkpoint.every_updates and self.state.step != self.plan.updates:
            return
        progress.phase("checkpoint", f"step {self.state.step}")
        state = ckpt.TrainingState(
            step=self.state.step,
            cycle=self.state.step,
            policy_version=self.state.step,
            data_cursor=self.state.data_cursor,
            plan_digest=self.plan.plan_digest,
            config_digest=self.plan.config_digest,
            extra={
                "metrics": [m.model_dump(mode="json") for m in self.state.metrics],
            },
        )
        params = dict(self.runtime.named_trainable_parameters())
        root = self.run_dir / "checkpoints"
        ckpt.write_checkpoint(root, state, params, self.optimizer, self.runtime.save_student_adapter)
        for old in list_checkpoints(root)[: -self.config.checkpoint.keep_last]:
            shutil.rmtree(old)

    # -- one cycle ----------------------------------------------------------------------------
    def _rollout(self, prompts: list[PromptRow]) -> list[Trajectory]:
        from miniverl.rollout.hf import generate_group

        r = self.config.rollout
        with self.runtime.generation_model() as model:
            sampled = generate_group(
                model,
                self.runtime.tokenizer,
                prompts,
                samples_per_prompt=r.samples_per_prompt,
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                top_k=r.top_k,
                seed=self.config.run.seed,
                policy_version=self.state.step,
                batch_size=r.batch_size,
                use_chat_template=r.use_chat_template,
            )
        return sampled

    def _score(self, prompts: list[PromptRow], trajectories: list[Trajectory]) -> list[RewardScore]:
        by_id = {row.prompt_id: row for row in prompts}
        scores = []
        for traj in trajectories:
            row = by_id[traj.prompt_id]
            meta = reward_meta(row, response_token_count=traj.response_token_count, sample_index=traj.sample_index)
            scores.append(self.reward.score(row.prompt, traj.response_text, **meta))
        return scores

    def _advantages(self, trajectories: list[Trajectory], rewards: list[float]) -> list[float]:
        g = self.config.algorithm.grpo
        scores = torch.tensor(rewards, dtype=torch.float64)
        adv = grpo_advantages(scores, [t.group_id for t in trajectories], norm_by_std=g.norm_by_std, eps=g.eps)
        return [float(a) for a in adv]

    def _update_sequences(
        self, prompts: list[PromptRow], trajectories: list[Trajectory], advantages: list[float] | None
    ) -> list[UpdateSequence]:
        from miniverl.rollout.hf import encode_prompt

        teacher = self.config.models.teacher
        context = teacher.privileged_context if teacher is not None else None
        by_id = {row.prompt_id: row for row in prompts}
        teacher_prompts: dict[str, list[int]] = {}
        sequences = []
        for index, traj in enumerate(trajectories):
            teacher_ids = teacher_start = None
            if self.config.algorithm.name == "opd":
                if context is not None:
                    if traj.prompt_id not in teacher_prompts:
                        row = by_id[traj.prompt_id]
                        text = context.template.format(prompt=row.prompt, context=getattr(row, context.column))
                        teacher_prompts[traj.prompt_id] = encode_prompt(
                            self.runtime.tokenizer, text, use_chat_template=self.config.rollout.use_chat_template
                        )
                    t_prompt = teacher_prompts[traj.prompt_id]
                else:
                    t_prompt = list(traj.prompt_token_ids)
                teacher_ids = tuple(t_prompt + list(traj.response_token_ids))
                teacher_start = len(t_prompt)
            sequences.append(
                UpdateSequence(
                    student_ids=tuple(traj.prompt_token_ids + traj.response_token_ids),
                    response_start=len(traj.prompt_token_ids),
                    teacher_ids=teacher_ids,
                    teacher_response_start=teacher_start,
                    response_len=len(traj.response_token_ids),
                    advantage=advantages[index] if advantages is not None else 0.0,
                )
            )
        return sequences

    def _optimizer_step(self) -> tuple[float, float]:
        params = self.runtime.trainable_parameters()
        before = [p.detach().clone() for p in params]
        max_norm = self.config.train.max_grad_norm
        grads = [p.grad for p in params if p.grad is not None]
        if max_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        delta = math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(params, before, strict=True)))
        return grad_norm, delta

    def run_cycle(self) -> MetricsLine:
        cycle_start = time.perf_counter()
        cfg = self.config
        prompts = cycle_prompts(self.rows, self.order, self.state.data_cursor, cfg.rollout.prompts_per_cycle)
        if self.runtime.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.runtime.device)
        n = len(prompts) * cfg.rollout.samples_per_prompt
        progress.phase("rollout", f"{n} sequences, <= {cfg.rollout.max_new_tokens} new tokens each")
        trajectories = self._rollout(prompts)
        scores = self._score(prompts, trajectories)
        rollout_seconds = time.perf_counter() - cycle_start
        rewards = [score.total for score in scores]
        groups: dict[str, list[float]] = {}
        for traj, reward in zip(trajectories, rewards, strict=True):
            groups.setdefault(traj.group_id, []).append(reward)
        group_std = max(statistics.pstdev(values) for values in groups.values())
        advantages = None
        if cfg.algorithm.name == "grpo":
            advantages = self._advantages(trajectories, rewards)
        sequences = self._update_sequences(prompts, trajectories, advantages)
        progress.phase("update", f"{sum(len(t.response_token_ids) for t in trajectories)} response tokens")
        update_start = time.perf_counter()
        stats: UpdateStats = (
            grpo_update(self.runtime, sequences, cfg)
            if cfg.algorithm.name == "grpo"
            else opd_update(self.runtime, sequences, cfg)
        )
        grad_norm, delta = self._optimizer_step()
        update_seconds = time.perf_counter() - update_start
        self.state.step += 1
        self.state.data_cursor += cfg.rollout.prompts_per_cycle
        self._write_trajectories(trajectories, scores, advantages)
        cuda = self.runtime.device.type == "cuda"
        line = MetricsLine(
            step=self.state.step,
            cycle=self.state.step,
            policy_version=self.state.step - 1,
            algorithm=cfg.algorithm.name,
            loss=stats.loss,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            reward_std_within_group_max=group_std,
            nonzero_advantages=sum(abs(a) > 0 for a in advantages) if advantages is not None else None,
            kl=stats.kl,
            grad_norm=grad_norm,
            adapter_delta_norm=delta,
            response_tokens=stats.tokens,
            trajectories=len(trajectories),
            rollout_seconds=rollout_seconds,
            update_seconds=update_seconds,
            cycle_seconds=time.perf_counter() - cycle_start,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.runtime.device) if cuda else None,
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.runtime.device) if cuda else None,
        )
        self.state.metrics.append(line)
        self._checkpoint()
        self._write_metrics()
        return line

    def _write_trajectories(
        self, trajectories: list[Trajectory], scores: list[RewardScore], advantages: list[float] | None
    ) -> None:
        records = [
            TrajectoryRecord.from_trajectory(
                traj,
                reward=score.total,
                reward_components=score.components,
                advantage=advantages[i] if advantages is not None else None,
            )
            for i, (traj, score) in enumerate(zip(trajectories, scores, strict=True))
        ]
        path = self.run_dir / "trajectories" / f"cycle-{self.state.step:06d}.jsonl"
        write_trajectories_jsonl(path, records)

    def _write_metrics(self) -> None:
        text = "".join(canonical_json(m.model_dump(mode="json")) + "\n" for m in self.state.metrics)
        atomic_write_text(self.run_dir / "metrics.jsonl", text)

    def release(self) -> None:
        """Drop the optimizer state and the runtime reference so teardown can free device memory."""
        self.optimizer.state.clear()
        self.optimizer.param_groups.clear()
        del self.runtime

    def run(self) -> None:
        progress.start_cycles(self.state.step, self.plan.updates)
        while self.state.step < self.plan.updates:
            line = self.run_cycle()
            progress.cycle_done(self.state.step, self.plan.updates, line)
            if self.progress is not None:
                self.progress(self.state.step, self.plan.updates, line)
            if self.on_update is not None:
                self.on_update(self.state.step)
