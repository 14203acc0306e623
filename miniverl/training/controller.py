"""The training controller: cycles of rollout -> score -> algorithm -> checkpoint, and metrics. Thin by design.

Everything algorithm-specific (roles, targets/advantages, the optimizer step(s), extra checkpoint
state) lives in :mod:`miniverl.training.algorithms`.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from miniverl import progress
from miniverl import progress as _progress  # __init__'s ``progress`` argument shadows the module
from miniverl.artifacts.rundir import roll_back_outputs
from miniverl.canonical import atomic_write_text, canonical_json, sha256_file
from miniverl.config.schema import MiniverlConfig
from miniverl.data import PromptRow
from miniverl.errors import CheckpointError, MiniverlError
from miniverl.evaluation import periodic_evaluator
from miniverl.records import MetricsLine, PlanRecord
from miniverl.rewards import RewardScore
from miniverl.rewards.reward_model import MixedReward, RewardModel
from miniverl.rollout.agreement import mismatch_metrics
from miniverl.rollout.backends import RolloutBackend, VllmBackend, rollout_backend
from miniverl.rollout.hf import RolloutReport, Trajectory
from miniverl.rollout.records import TokenGae, TrajectoryRecord, write_trajectories_jsonl
from miniverl.rollout.weights import policy_digest
from miniverl.runtime.base import RoleRuntime
from miniverl.training import checkpoint as ckpt
from miniverl.training.algorithms import AlgorithmStep, CycleBatch, build_algorithm
from miniverl.training.algorithms.base import resolve_adapter_precision
from miniverl.training.checkpoint_files import prune_checkpoints, trajectory_file_name
from miniverl.training.memory import plan_vllm
from miniverl.training.update import rollout_token_logprobs


class MemoryLimitError(MiniverlError):
    """A cycle's CUDA peak reserved memory exceeded ``memory.max_peak_reserved_gib``."""


#: the points ``on_phase`` is called at, in cycle order (a kill at any of them must resume exactly)
PHASES = ("rollout", "score", "update", "checkpoint")


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
        on_phase: Callable[[str, int], None] | None = None,
        backend: RolloutBackend | None = None,
        load_metrics: dict[str, float] | None = None,
    ) -> None:
        self.config = config
        self.backend = backend if backend is not None else rollout_backend(config.rollout)
        lora = config.models.student.lora
        self.backend.bind(runtime.save_student_adapter, lora.r if lora is not None else None)
        if isinstance(self.backend, VllmBackend):
            self.backend.configure(plan_vllm(config, runtime, rows, resolve_adapter_precision(config, runtime.device)))
        self.plan = plan
        self.runtime = runtime
        self.rows = list(rows)
        self.run_dir = run_dir
        self.on_update = on_update
        self.progress = progress
        self.on_phase = on_phase
        self.order = prompt_order(self.rows, shuffle=config.data.shuffle, seed=config.run.seed)
        reward_model = None
        if config.models.reward is not None:
            reward_model = RewardModel(
                config.models.reward,
                device=runtime.device,
                student_tokenizer=runtime.tokenizer,
                expected_identity=plan.models.get("reward"),
            )
        self.reward = MixedReward(config.algorithm.rewards, reward_model)
        self.evaluate = periodic_evaluator(config, plan)  # algorithm.eval_every: None when off
        self.algorithm = build_algorithm(config, runtime)
        self.algorithm.prepare(self.rows)
        self.optimizer = self.algorithm.actor.optimizer
        _progress.phase(
            "load",
            f"adapter precision {self.algorithm.actor.precision} (train.adapter_precision "
            f"{config.train.adapter_precision})",
        )
        #: recorded on every metrics line: the adapter precision this run trains in (1.0: bf16_master) and
        #: what the load decided beside it (the memory plan, when a budget chose one)
        self.load_metrics = {
            "train/adapter_bf16_master": float(self.algorithm.actor.precision == "bf16_master"),
            **(load_metrics or {}),
        }
        self.state = Progress()
        #: trajectories/ file name -> sha256 of every update so far (checkpoint.json binds them)
        self.trajectory_hashes: dict[str, str] = {}

    # -- checkpoint I/O ---------------------------------------------------------------------
    def restore(self, directory: Path, record: Any) -> None:
        params, opt_tensors, state = ckpt.read_checkpoint(directory)
        if set(self.algorithm.actor.named()) != set(params):
            raise CheckpointError(f"checkpoint {directory.name} does not match this plan's adapter")
        self.algorithm.actor.load(params)  # the masters under bf16_master; the model's tensors re-derived
        ckpt.optimizer_from_tensors(self.optimizer, opt_tensors, state["optimizer"])
        extra = state["extra"]
        names = sorted(self.algorithm.state_tensors())
        if names:
            try:
                self.algorithm.load_state(ckpt.read_extra_tensors(directory, names), extra.get("algorithm", {}))
            except (KeyError, ValueError) as exc:
                raise CheckpointError(f"checkpoint {directory.name}: {exc}") from None
        ckpt.restore_rng_from(directory, state)
        self.state = Progress(step=record.step, data_cursor=record.data_cursor)
        self.state.metrics = [MetricsLine.model_validate(m) for m in extra["metrics"]]
        # the checkpoint is the commit point: drop what later, uncommitted updates wrote
        roll_back_outputs(self.run_dir, self._metrics_text(), record.trajectories, directory.name)
        self.trajectory_hashes = dict(record.trajectories)
        # a kill between the last checkpoint and its prune left an older one: finish that prune
        prune_checkpoints(self.run_dir / "checkpoints", self.config.checkpoint.keep_last)

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
            metrics_lines=len(self.state.metrics),
            trajectories=dict(self.trajectory_hashes),
            extra={
                "metrics": [m.model_dump(mode="json") for m in self.state.metrics],
                "algorithm": self.algorithm.state_json(),
            },
        )
        params = self.algorithm.actor.named()
        root = self.run_dir / "checkpoints"
        extra_dirs = {"critic": self.runtime.save_critic} if self.runtime.has_role("critic") else None
        with ExitStack() as masters:  # PEFT saves of the student (and critic) write the fp32 masters
            for trained in self.algorithm.trained():
                masters.enter_context(trained.masters_in_model())
            self._write_checkpoint(root, state, params, extra_dirs)
        prune_checkpoints(root, self.config.checkpoint.keep_last)

    def _write_checkpoint(
        self,
        root: Path,
        state: ckpt.TrainingState,
        params: dict[str, torch.nn.Parameter],
        extra_dirs: dict[str, Any] | None,
    ) -> None:
        ckpt.write_checkpoint(
            root,
            state,
            params,
            self.optimizer,
            self.runtime.save_student_adapter,
            extra_tensors=self.algorithm.state_tensors(),
            extra_dirs=extra_dirs,
        )

    # -- one cycle ----------------------------------------------------------------------------
    def _phase(self, name: str, cycle_index: int) -> None:
        """``on_phase(name, cycle_index)``: ``cycle_index`` is the updates done before this cycle."""
        if self.on_phase is not None:
            self.on_phase(name, cycle_index)

    def _rollout(self, prompts: list[PromptRow], report: RolloutReport | None = None) -> list[Trajectory]:
        r = self.config.rollout
        with self.runtime.generation_model() as model:
            sampled = self.backend.generate(
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
                engine=r.engine,
                policy_tensors=self.algorithm.actor.named(),
                report=report,
            )
        return sampled

    def _trainer_logprobs(self, trajectories: list[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """A foreign backend's samples with the trainer's own log-prob of each response token (under the weights
        the rollout used: before the update), and the step's rollout/trainer mismatch and switch times."""
        sequences = CycleBatch(prompts=[], trajectories=trajectories, scores=[], logprob_source="foreign").sequences()
        old, _ = rollout_token_logprobs(self.runtime, sequences, self.config, with_reference=False)
        recomputed = [tuple(float(v) for v in piece.float().tolist()) for piece in old]
        with_old = [replace(t, old_logprobs=lp) for t, lp in zip(trajectories, recomputed, strict=True)]
        metrics = mismatch_metrics([t.sampled_logprobs for t in trajectories], recomputed)
        return with_old, {**metrics, **self.backend.switch_metrics()}

    def _policy_digest(self) -> str:
        """:func:`policy_digest` of the trainable student adapter tensors, now."""
        return policy_digest(self.algorithm.actor.named())

    def _score(self, prompts: list[PromptRow], trajectories: list[Trajectory]) -> list[RewardScore]:
        return self.reward.score_batch(prompts, trajectories)

    def _reward_model_metrics(self, scores: list[RewardScore]) -> dict[str, float]:
        rm = self.reward.rm
        if rm is None:
            return {}
        values = [s.components["reward_model"] for s in scores]
        out = {
            "reward_model/mean": statistics.fmean(values),
            "reward_model/std": statistics.pstdev(values),
            "reward_model/transfers": float(rm.transfers),
            "reward_model/offloaded_after_phase": float(rm.location == "cpu"),
            "reward_model/bytes": float(rm.nbytes()),
        }
        if self.runtime.device.type != "cpu":  # on a CPU run "on the device" and "offloaded" are the same place
            out["reward_model/device_bytes_after_phase"] = float(rm.nbytes(on=self.runtime.device))
        return out

    def run_cycle(self) -> MetricsLine:
        cycle_start = time.perf_counter()
        cfg = self.config
        index = self.state.step
        prompts = cycle_prompts(self.rows, self.order, self.state.data_cursor, cfg.rollout.prompts_per_cycle)
        if self.runtime.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.runtime.device)
        self._phase("rollout", index)
        n = len(prompts) * cfg.rollout.samples_per_prompt
        progress.phase("rollout", f"{n} sequences, <= {cfg.rollout.max_new_tokens} new tokens each")
        on_policy = self.algorithm.on_policy
        report = RolloutReport()
        if on_policy:
            trajectories = self._rollout(prompts, report)
        else:  # SFT / KD: the dataset's oracle trajectories, nothing sampled and nothing to score
            trajectories = self.algorithm.oracle_trajectories(prompts, policy_version=self.state.step)
        self._phase("score", index)
        scores = self._score(prompts, trajectories) if on_policy else []
        rollout_seconds = time.perf_counter() - cycle_start
        source = self.backend.logprob_source if on_policy else "trainer"
        foreign_metrics: dict[str, float] = {}
        if source == "foreign":
            trajectories, foreign_metrics = self._trainer_logprobs(trajectories)
        batch = CycleBatch(prompts=prompts, trajectories=trajectories, scores=scores, logprob_source=source)
        rewards = batch.rewards
        groups: dict[str, list[float]] = {}
        for traj, reward in zip(trajectories, rewards, strict=False):
            groups.setdefault(traj.group_id, []).append(reward)
        group_std = max(statistics.pstdev(values) for values in groups.values()) if groups else None
        cuda = self.runtime.device.type == "cuda"
        update_start_allocated = torch.cuda.memory_allocated(self.runtime.device) if cuda else None
        self._phase("update", index)
        progress.phase("update", f"{sum(len(t.response_token_ids) for t in trajectories)} response tokens")
        digest_before = self._policy_digest()
        update_start = time.perf_counter()
        result: AlgorithmStep = self.algorithm.update(batch, step=self.state.step)
        update_seconds = time.perf_counter() - update_start
        digest_after = self._policy_digest()
        self.state.step += 1
        evaluated = self.evaluate(self.runtime, self.reward, self.state.step) if self.evaluate is not None else {}
        self.state.data_cursor += cfg.rollout.prompts_per_cycle
        self._write_trajectories(trajectories, scores, result.advantages, result.gae)
        line = MetricsLine(
            step=self.state.step,
            cycle=self.state.step,
            policy_version=self.state.step - 1,
            algorithm=cfg.algorithm.name,
            loss=result.loss,
            reward_mean=statistics.fmean(rewards) if rewards else None,
            reward_std=statistics.pstdev(rewards) if rewards else None,
            reward_std_within_group_max=group_std,
            nonzero_advantages=result.nonzero_advantages,
            kl=result.kl,
            grad_norm=result.grad_norm,
            adapter_delta_norm=result.adapter_delta_norm,
            response_tokens=result.tokens,
            trajectories=len(trajectories),
            rollout_seconds=rollout_seconds,
            update_seconds=update_seconds,
            cycle_seconds=time.perf_counter() - cycle_start,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(self.runtime.device) if cuda else None,
            peak_allocated_bytes=torch.cuda.max_memory_allocated(self.runtime.device) if cuda else None,
            update_start_allocated_bytes=update_start_allocated,
            rollout_backend=report.backend,
            policy_digest_rollout=report.policy_digest,
            policy_digest_before=digest_before,
            policy_digest_after=digest_after,
            algorithm_metrics={
                k: v
                for k, v in sorted(
                    {
                        **result.metrics,
                        **self._reward_model_metrics(scores),
                        **evaluated,
                        **self.load_metrics,
                        **foreign_metrics,
                    }.items()
                )
                if math.isfinite(v)
            },
        )
        self._check_memory_limit(line)
        self.state.metrics.append(line)
        # commit order: trajectories and metrics are durable (fsynced) before the checkpoint that binds them,
        # so a kill anywhere leaves either an older commit point (resume rolls the outputs back) or this one
        self._write_metrics()
        self._phase("checkpoint", index)
        self._checkpoint()
        return line

    def _check_memory_limit(self, line: MetricsLine) -> None:
        limit = self.config.memory.max_peak_reserved_gib
        if limit is None or line.peak_reserved_bytes is None:
            return
        peak = line.peak_reserved_bytes / 2**30
        if peak > limit:
            raise MemoryLimitError(
                f"cycle {line.cycle} reserved {peak:.3f} GiB at peak, above memory.max_peak_reserved_gib "
                f"{limit:g}; lower the batch sizes or raise the limit (the cycle was not checkpointed)"
            )

    def _write_trajectories(
        self,
        trajectories: list[Trajectory],
        scores: list[RewardScore],
        advantages: list[float] | None,
        gae: list[TokenGae] | None = None,
    ) -> None:
        records = [
            TrajectoryRecord.from_trajectory(
                traj,
                reward=scores[i].total if scores else None,
                reward_components=scores[i].components if scores else None,
                advantage=advantages[i] if advantages is not None else None,
                gae=gae[i] if gae is not None else None,
            )
            for i, traj in enumerate(trajectories)
        ]
        name = trajectory_file_name(self.state.step)
        write_trajectories_jsonl(self.run_dir / "trajectories" / name, records)
        self.trajectory_hashes[name] = sha256_file(self.run_dir / "trajectories" / name)

    def _metrics_text(self) -> str:
        return "".join(canonical_json(m.model_dump(mode="json")) + "\n" for m in self.state.metrics)

    def _write_metrics(self) -> None:
        atomic_write_text(self.run_dir / "metrics.jsonl", self._metrics_text())

    def release(self) -> None:
        """Drop the optimizer states and the runtime reference so teardown can free device memory."""
        self.algorithm.actor.release()
        self.algorithm.release()
        self.reward.close()
        del self.algorithm
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
