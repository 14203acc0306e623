"""``miniverl bench grpo``: one GRPO step (rollout + update) and the update alone, side by side in one process.

Same random weights (a model shape from its config, seeded), same prompts (``prompt_tokens`` random
ids per row), same sampling (temperature 1) and fixed completion lengths (no reachable EOS id), so
lengths cannot decide a ratio.

GRPO step paths (``prompts`` groups of ``samples`` completions of ``new_tokens`` tokens):

* ``miniverl_fast``: miniverl's step as training runs it: :func:`miniverl.rollout.generate_group`
  with the fast engine, seeded rewards, group advantages, :func:`~miniverl.training.algorithms.grpo.grpo_update`
  on the role runtime (LoRA r16, PEFT's default fp32 adapter), gradient clipping, AdamW;
* ``miniverl_fast_bf16``: the same with bf16 adapter tensors and fp32 master copies in the
  optimizer (:class:`~miniverl.training.update.Bf16MasterAdapter`; bf16 models only);
* ``miniverl_lean``: the step as training builds it: ``adapter_precision`` auto (bf16 + fp32 masters on
  a bf16 model) through :class:`~miniverl.training.algorithms.base.TrainedParameters`, and with
  ``--memory-budget-gib`` the memory plan's activation checkpointing, micro-batch and log-prob chunk
  (``--memory-budget-gib trl``: under TRL's peak reserved as measured in the same run, its cell first);
* ``miniverl_hf``: the same step with the transformers decode loop (``engine="hf"``);
* ``trl``: TRL's ``GRPOTrainer`` on the same model shape and lengths when ``trl`` is importable,
  else recorded ``not_run`` with the reason (never ``passed``).

Update paths (``update_shape`` = B rows of T tokens, the first ``min(32, T // 4)`` the prompt):

* ``naive_hf_peft``: HF + PEFT as a first implementation writes it: full logits, ``log_softmax``
  over the vocabulary in fp32, the policy-gradient loss, backward, AdamW (PEFT's fp32 adapter);
* ``miniverl_update``: :func:`grpo_update` on the role runtime (chunked log-probs of the selected
  positions only) + AdamW, PEFT's fp32 adapter;
* ``miniverl_update_bf16``: the same with :class:`Bf16MasterAdapter` (bf16 models only).

Per cell: ``warmup`` untimed steps (the first is ``first_call_seconds``: graph capture, cuDNN/SDPA
plans), then the median of ``repeats`` (default 5) CUDA-synchronized steps with their spread (range,
quartiles); peak reserved is ``torch.cuda.max_memory_reserved`` over the timed steps, each cell
starting from an emptied cache with its own model (the previous cell's runner and model dropped first).
Each miniverl cell also records ``estimated_peak_gib``, the memory plan's estimate for its settings.
Writes ``grpo.json``, ``grpo.md`` and ``grpo.svg``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import torch

from miniverl import progress
from miniverl.bench.common import package_version, random_prompt_ids, save_partial, spread
from miniverl.bench.grpo_args import GRPO_MODELS, STEP_PATHS, UPDATE_PATHS, add_grpo_arguments
from miniverl.canonical import atomic_write_json, atomic_write_text, sha256_file
from miniverl.errors import UsageError
from miniverl.gate.models import LORA_TARGETS
from miniverl.models.loading import resolve_device

FORMAT = "miniverl-grpo-bench/v1"
GIB = float(1 << 30)


@dataclass
class GrpoBenchOptions:
    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    prompts: int = 2
    samples: int = 8
    new_tokens: int = 256
    prompt_tokens: int = 32
    rollout_batch: int = 16
    warmup: int = 1
    repeats: int = 5
    paths: tuple[str, ...] = STEP_PATHS
    update_paths: tuple[str, ...] = UPDATE_PATHS
    update_shape: tuple[int, int] = (8, 512)
    learning_rate: float = 1e-5
    activation_checkpointing: int = 0  # miniverl cells: recompute every n-th decoder layer in backward (0: off)
    seed: int = 0
    #: miniverl_lean: the memory plan's budget in GiB, or "trl" (TRL's peak reserved measured in the same run);
    #: None: training's defaults
    memory_budget_gib: float | str | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    from miniverl.rollout.engine import release_engines

    release_engines()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def random_config(name: str) -> Any:
    """The config of a model shape: Qwen3 (``tiny``, ``qwen3-0.6b-shape``) or SmolLM2-135M's Llama shape."""
    if name == "smollm2-shape":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
            intermediate_size=1536, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
    from miniverl.gate.models import qwen3_config

    return qwen3_config(name)


class RandomLoader:
    """A role-runtime loader: the same seeded random model (sdpa) on every load, no tokenizer."""

    def __init__(self, name: str, seed: int) -> None:
        self.name, self.seed = name, seed
        self.config = random_config(name)
        self._template: Any = None

    def model(self, device: torch.device, dtype: torch.dtype) -> Any:
        from transformers import AutoModelForCausalLM

        if self._template is None:
            config = copy.deepcopy(self.config)
            config._attn_implementation = "sdpa"
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                self._template = AutoModelForCausalLM.from_config(config)
        return copy.deepcopy(self._template).to(device=device, dtype=dtype).eval()

    def __call__(self, spec: Any, settings: Any) -> Any:
        from miniverl.runtime.loading import LoadedBase

        model = self.model(settings.device, settings.dtype)
        return LoadedBase(model=model, tokenizer=None, identity={"random_init": self.name, "seed": self.seed})


class IdTokenizer:
    """Prompts are space-separated token ids; responses decode to nothing (the bench never reads them)."""

    chat_template = None
    pad_token_id = 0
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""


def _runtime(
    loader: RandomLoader, device: torch.device, dtype_name: str, train_batch: int, checkpointing: int = 0
) -> Any:
    """A dual-model role runtime on the random model (LoRA r16, seeded init); ``.bench_config`` is what
    :func:`grpo_update` reads."""
    from miniverl.config.schema import ModelsSection
    from miniverl.gate.workload import set_student_init
    from miniverl.runtime import build_runtime

    section = ModelsSection.model_validate(
        {
            "runtime": "dual_model",
            "dtype": dtype_name,
            "attn_implementation": "sdpa",
            "student": {"source": "local", "path": f"random-init:{loader.name}",
                        "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": LORA_TARGETS}},
        }
    )  # fmt: skip
    runtime: Any = build_runtime(section, device=device, loader=loader, activation_checkpointing=checkpointing)
    set_student_init(runtime, seed=loader.seed + 1)
    runtime.bench_config = SimpleNamespace(  # what grpo_update reads
        algorithm=SimpleNamespace(grpo=_grpo_section()),
        train=SimpleNamespace(logprob_chunk_size=1024, trajectory_batch_size=train_batch),
    )
    return runtime


def _grpo_section() -> Any:
    from miniverl.config.schema import GrpoSection

    return GrpoSection()


class _Trainer:
    """AdamW over the runtime's adapter (fp32, or bf16 with fp32 masters), clipped at 1.0 like training."""

    def __init__(self, runtime: Any, lr: float, bf16_master: bool) -> None:
        from miniverl.training.update import Bf16MasterAdapter

        params = runtime.trainable_parameters()
        self.master = Bf16MasterAdapter(params) if bf16_master else None
        self.params = self.master.masters if self.master is not None else params
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.model_params = params

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model_params, 1.0)
        if self.master is not None:
            self.master.step(self.optimizer)
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def _lean_workload(opts: GrpoBenchOptions, device: torch.device, dtype_name: str, precision: str,
                   fast: bool = True) -> Any:  # fmt: skip
    """The memory plan's view of the bench's GRPO step (no frozen models beside the student)."""
    from miniverl.runtime.memory_plan import Workload

    rows = opts.prompts * opts.samples
    return Workload(
        dtype=dtype_name,  # type: ignore[arg-type]
        adapter_precision=precision,  # type: ignore[arg-type]
        lora_rank=16,
        lora_targets=tuple(LORA_TARGETS),
        row_tokens=opts.prompt_tokens + opts.new_tokens,
        update_rows=rows,
        logprob_chunk=1024,
        rollout_rows=min(opts.rollout_batch, rows),
        rollout_capacity=opts.prompt_tokens + opts.new_tokens,
        fast_engine=fast and device.type == "cuda",
    )


def _lean_precision(dtype_name: str) -> Literal["fp32", "bf16_master"]:
    """The lean path's adapter precision: bf16_master on a bf16 model (on CPU too, as a config may choose it;
    training's ``auto`` picks it on CUDA only), else PEFT's fp32 adapter."""
    return "bf16_master" if dtype_name == "bfloat16" else "fp32"


def _lean_runtime(loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str
                  ) -> tuple[Any, Any]:  # fmt: skip
    """The runtime and optimizer as training builds them: ``adapter_precision: auto`` (bf16_master on a
    bf16 model; CPU included, as a config may choose it), :class:`TrainedParameters` (clip, AdamW over
    the masters), and with ``--memory-budget-gib`` the memory plan (checkpointing and micro-batch
    ``auto``) applied to the runtime; without a budget, training's defaults (no checkpointing)."""
    from miniverl.runtime.memory_plan import DecoderDims, choose_plan
    from miniverl.training.algorithms.base import TrainedParameters

    rows = opts.prompts * opts.samples
    precision = _lean_precision(dtype_name)
    runtime = _runtime(loader, device, dtype_name, train_batch=rows, checkpointing=0)
    runtime.memory_plan = None
    if opts.memory_budget_gib is not None:
        assert isinstance(opts.memory_budget_gib, float), "run_grpo_bench resolves 'trl' first"
        plan = choose_plan(
            DecoderDims.from_hf_config(runtime.student_config()),
            _lean_workload(opts, device, dtype_name, precision),
            opts.memory_budget_gib,
            activation_checkpointing="auto",
            trajectory_batch_size="auto",
        )
        runtime.apply_memory_plan(
            activation_checkpointing=plan.activation_checkpointing,
            max_tokens=plan.max_tokens,
            release_rollout_engine=plan.release_rollout,
        )
        runtime.bench_config.train.trajectory_batch_size = "auto"
        runtime.bench_config.train.logprob_chunk_size = plan.logprob_chunk
        runtime.memory_plan = plan
        progress.phase("memory plan", plan.describe())
    trainer = TrainedParameters(
        list(runtime.named_trainable_parameters()), lr=opts.learning_rate, betas=(0.9, 0.999), eps=1e-8,
        weight_decay=0.0, max_grad_norm=1.0, bf16_master=precision == "bf16_master",
    )  # fmt: skip
    return runtime, trainer


def estimated_peak_gib(section: str, path: str, holder: Any, opts: GrpoBenchOptions, device: torch.device,
                       dtype_name: str, config: Any) -> float | None:  # fmt: skip
    """The memory plan's estimate for a miniverl cell, with the settings that cell ran (None: not miniverl's)."""

    from miniverl.runtime.memory_plan import GIB as PLAN_GIB
    from miniverl.runtime.memory_plan import DecoderDims, estimate

    if not path.startswith("miniverl"):
        return None
    plan = getattr(holder, "memory_plan", None)
    if plan is not None:
        return float(plan.estimate.peak / PLAN_GIB)
    dims = DecoderDims.from_hf_config(config)
    bf16 = path.endswith("_bf16") or (path == "miniverl_lean" and _lean_precision(dtype_name) == "bf16_master")
    every = opts.activation_checkpointing if path != "miniverl_lean" else 0
    checkpointed = -(-dims.layers // every) if every else 0
    if section == "update":
        batch, length = opts.update_shape
        work = dataclasses.replace(
            _lean_workload(opts, device, dtype_name, "bf16_master" if bf16 else "fp32", fast=False),
            row_tokens=length, update_rows=batch, rollout_rows=1, rollout_capacity=1,
        )  # fmt: skip
        rows = batch
    else:
        work = _lean_workload(opts, device, dtype_name, "bf16_master" if bf16 else "fp32", fast=path != "miniverl_hf")
        rows = opts.prompts * opts.samples
    return float(estimate(dims, work, micro_rows=rows, checkpointed_layers=checkpointed).peak / PLAN_GIB)


def _update_sequences(rows: list[tuple[list[int], list[int]]], advantages: list[float]) -> list[Any]:
    from miniverl.training.update import UpdateSequence

    return [
        UpdateSequence(
            student_ids=tuple(prompt + response),
            response_start=len(prompt),
            teacher_ids=None,
            teacher_response_start=None,
            response_len=len(response),
            advantage=adv,
        )
        for (prompt, response), adv in zip(rows, advantages, strict=True)
    ]


def _step_runner(path: str, loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str
                 ) -> tuple[Callable[[int], dict[str, float]], Any]:  # fmt: skip
    """``run(step) -> {"rollout_seconds", "update_seconds"}`` for a miniverl GRPO step path."""
    from miniverl.algorithms import grpo_advantages
    from miniverl.rollout.hf import PromptInput, generate_group
    from miniverl.training.algorithms.grpo import grpo_update

    rows = opts.prompts * opts.samples
    trainer: Any
    if path == "miniverl_lean":
        runtime, trainer = _lean_runtime(loader, opts, device, dtype_name)
    else:
        runtime = _runtime(loader, device, dtype_name, train_batch=rows, checkpointing=opts.activation_checkpointing)
        trainer = _Trainer(runtime, opts.learning_rate, bf16_master=path == "miniverl_fast_bf16")
    vocab = int(loader.config.vocab_size)
    prompts = [
        PromptInput(f"p{i}", " ".join(map(str, ids)))
        for i, ids in enumerate(random_prompt_ids(opts.prompts, opts.prompt_tokens, vocab, opts.seed))
    ]
    engine: Literal["fast", "hf"] = "hf" if path == "miniverl_hf" else "fast"
    tokenizer = IdTokenizer()

    def run(step: int) -> dict[str, float]:
        _sync(device)
        start = time.perf_counter()
        with runtime.generation_model() as model:
            trajectories = generate_group(
                model, tokenizer, prompts, samples_per_prompt=opts.samples, max_new_tokens=opts.new_tokens,
                temperature=1.0, seed=opts.seed, policy_version=step, batch_size=opts.rollout_batch,
                eos_token_ids=[vocab], engine=engine,
            )  # fmt: skip
        _sync(device)
        rolled = time.perf_counter()
        lengths = {len(t.response_token_ids) for t in trajectories}
        if lengths != {opts.new_tokens} or len(trajectories) != rows:
            raise RuntimeError(f"fixed lengths broken: {len(trajectories)} rows of lengths {sorted(lengths)}")
        rng = random.Random(opts.seed * 7919 + step)
        scores = torch.tensor([rng.random() for _ in trajectories], dtype=torch.float64)
        advantages = [float(a) for a in grpo_advantages(scores, [t.group_id for t in trajectories])]
        sequences = _update_sequences(
            [(list(t.prompt_token_ids), list(t.response_token_ids)) for t in trajectories], advantages
        )
        grpo_update(runtime, sequences, runtime.bench_config)
        trainer.step()
        _sync(device)
        done = time.perf_counter()
        return {"rollout_seconds": rolled - start, "update_seconds": done - rolled}

    return run, runtime


def _update_runner(path: str, loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str
                   ) -> tuple[Callable[[int], dict[str, float]], Any]:  # fmt: skip
    """``run(step) -> {"update_seconds"}``: one optimizer update on B rows of T tokens."""
    batch, length = opts.update_shape
    vocab = int(loader.config.vocab_size)
    prompt = min(32, length // 4)
    ids = random_prompt_ids(batch, length, vocab, opts.seed + 1)
    gen = torch.Generator().manual_seed(opts.seed + 2)
    advantages = (torch.rand(batch, generator=gen) * 2 - 1).tolist()
    if path == "naive_hf_peft":
        import peft

        model = loader.model(device, getattr(torch, dtype_name))
        model = peft.get_peft_model(
            model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS)
        )
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=opts.learning_rate, weight_decay=0.0)
        input_ids = torch.tensor(ids, device=device)
        adv = torch.tensor(advantages, device=device, dtype=torch.float32)
        mask = torch.zeros(batch, length - 1, device=device)
        mask[:, prompt - 1 :] = 1.0

        def naive(step: int) -> dict[str, float]:
            _sync(device)
            start = time.perf_counter()
            logits = model(input_ids=input_ids).logits[:, :-1]
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
            loss = -(adv[:, None] * logp * mask).sum() / mask.sum()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            _sync(device)
            return {"update_seconds": time.perf_counter() - start}

        return naive, model
    from miniverl.training.algorithms.grpo import grpo_update

    runtime = _runtime(loader, device, dtype_name, train_batch=batch, checkpointing=opts.activation_checkpointing)
    trainer = _Trainer(runtime, opts.learning_rate, bf16_master=path == "miniverl_update_bf16")
    sequences = _update_sequences([(row[:prompt], row[prompt:]) for row in ids], advantages)

    def ours(step: int) -> dict[str, float]:
        _sync(device)
        start = time.perf_counter()
        grpo_update(runtime, sequences, runtime.bench_config)
        trainer.step()
        _sync(device)
        return {"update_seconds": time.perf_counter() - start}

    return ours, runtime


def measure(run: Callable[[int], dict[str, float]], *, warmup: int, repeats: int, device: torch.device
            ) -> dict[str, Any]:  # fmt: skip
    first = None
    step = 0
    for _ in range(warmup):
        _sync(device)
        start = time.perf_counter()
        run(step)
        step += 1
        first = first if first is not None else time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    parts: list[dict[str, float]] = []
    for _ in range(repeats):
        parts.append(run(step))
        step += 1
    totals = [sum(p.values()) for p in parts]
    out: dict[str, Any] = {
        "status": "measured",
        "first_call_seconds": first,
        "step_seconds": totals,
        "median_step_seconds": statistics.median(totals),
        "spread_step_seconds": spread(totals),
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None,
    }
    for key in parts[0]:
        out[f"median_{key}"] = statistics.median(p[key] for p in parts)
    return out


def _trl_cell(loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str) -> dict[str, Any]:
    try:
        import trl
    except ImportError as exc:
        return {"status": "not_run", "reason": f"trl is not importable in this environment ({exc})"}
    from miniverl.bench.grpo_trl import run_trl_cell

    try:
        return {"trl_version": trl.__version__, **run_trl_cell(loader, opts, device, dtype_name)}
    except Exception as exc:  # a TRL failure is recorded, never hidden behind miniverl's figures
        return {"status": "failed", "trl_version": trl.__version__, "reason": f"{type(exc).__name__}: {exc}"[:500]}


def run_grpo_bench(opts: GrpoBenchOptions, out: str | Path) -> dict[str, Any]:
    """Measure every step and update cell; write ``grpo.json``, ``grpo.md`` and ``grpo.svg``."""
    from miniverl.bench.grpo_render import evaluate_grpo_goals, render_grpo_markdown, render_grpo_svg

    validate_options(opts)
    device = resolve_device(opts.device)
    dtype_name = opts.dtype if opts.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    started = time.perf_counter()
    loader = RandomLoader(opts.model, opts.seed)
    completion_tokens = opts.prompts * opts.samples * opts.new_tokens
    cells: list[dict[str, Any]] = []
    sections = [("update", p) for p in opts.update_paths] + [("step", p) for p in opts.paths]  # cheap ones first
    if opts.memory_budget_gib == "trl" and "trl" in opts.paths:  # TRL's peak is the lean path's budget
        sections.remove(("step", "trl"))
        sections.insert(0, ("step", "trl"))
    progress.task("bench grpo", len(sections), "cells")
    for section, path in sections:
        progress.advance(len(cells), f"bench grpo, measuring {section} {path}")
        cell: dict[str, Any] = {"section": section, "path": path}
        _release(device)
        if device.type == "cuda":  # what an earlier cell left behind would count in this cell's peak
            cell["allocated_at_start_gib"] = torch.cuda.memory_allocated(device) / GIB
        if path.endswith("_bf16") and dtype_name != "bfloat16":
            cell.update(status="not_run", reason="bf16 adapter with fp32 masters needs a bf16 model (--dtype)")
        elif path == "trl":
            cell.update(_trl_cell(loader, opts, device, dtype_name))
        elif path == "miniverl_lean" and opts.memory_budget_gib == "trl" and _trl_peak(cells) is None:
            cell.update(status="not_run", reason="--memory-budget-gib trl, and TRL's peak reserved was not measured")
        else:
            factory = _step_runner if section == "step" else _update_runner
            holder: Any = None
            run: Any = None
            cell_opts = opts
            if opts.memory_budget_gib == "trl":
                cell_opts = dataclasses.replace(opts, memory_budget_gib=_trl_peak(cells))
                cell["memory_budget_gib"], cell["memory_budget_from"] = cell_opts.memory_budget_gib, "trl"
            try:
                run, holder = factory(path, loader, cell_opts, device, dtype_name)
                cell.update(measure(run, warmup=opts.warmup, repeats=opts.repeats, device=device))
                cell["estimated_peak_gib"] = estimated_peak_gib(
                    section, path, holder, cell_opts, device, dtype_name, loader.config
                )
                plan = getattr(holder, "memory_plan", None)
                if plan is not None:
                    cell["memory_plan"] = plan.metrics()
                _say_estimate(cell)
            except (RuntimeError, ValueError) as exc:  # one broken path must not hide the others' figures
                cell.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
            finally:
                close = getattr(holder, "close", None)
                if callable(close):
                    close()
                # the runner's closure holds the model and optimizer too: drop both, so that the next
                # cell's _release empties an allocator that holds nothing of this one
                del holder, run
        if cell.get("status") == "measured" and section == "step":
            cell["completion_tokens"] = completion_tokens
            cell["completion_tokens_per_second"] = completion_tokens / cell["median_step_seconds"]
        if cell.get("status") == "measured":
            cell["ms_per_step"] = cell["median_step_seconds"] * 1e3
        cells.append(cell)
        save_partial(Path(out) / "grpo.partial.json", FORMAT, cells)
    progress.advance(len(cells), "bench grpo")
    _release(device)
    report: dict[str, Any] = {
        "format": FORMAT,
        "options": asdict(opts),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "peft": package_version("peft"),
        "trl": package_version("trl"),
        "threads": torch.get_num_threads(),
        "dtype": dtype_name,
        "completion_tokens_per_step": completion_tokens,
        "cells": cells,
        "seconds": time.perf_counter() - started,
    }
    report["ratios"] = ratios(cells)
    report["goals"] = evaluate_grpo_goals(report)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "grpo.md", render_grpo_markdown(report))
    atomic_write_text(out_dir / "grpo.svg", render_grpo_svg(report))
    report["artifacts"] = {name: sha256_file(out_dir / name) for name in ("grpo.md", "grpo.svg")}
    atomic_write_json(out_dir / "grpo.json", report, pretty=True)
    (out_dir / "grpo.partial.json").unlink(missing_ok=True)
    return report


def _trl_peak(cells: list[dict[str, Any]]) -> float | None:
    """TRL's measured peak reserved GiB among the cells run so far (``None``: not measured)."""
    for cell in cells:
        if cell["path"] == "trl" and cell.get("status") == "measured" and cell.get("peak_reserved_gib"):
            return float(cell["peak_reserved_gib"])
    return None


def _say_estimate(cell: dict[str, Any]) -> None:
    """One line per miniverl cell: the memory plan's estimate beside the measured peak (CUDA)."""
    estimated, measured = cell.get("estimated_peak_gib"), cell.get("peak_reserved_gib")
    if estimated is None:
        return
    seen = f"measured {measured:.2f} GiB" if measured is not None else "not measured (no CUDA)"
    progress.phase("memory", f"{cell['section']} {cell['path']}: estimated {estimated:.2f} GiB peak reserved, {seen}")


def ratios(cells: list[dict[str, Any]]) -> dict[str, float | None]:
    """Speed (time ratio, reference / ours) and memory (peak reserved, ours / reference) between paths."""
    by = {(c["section"], c["path"]): c for c in cells if c.get("status") == "measured"}

    def speed(section: str, ours: str, ref: str) -> float | None:
        a, b = by.get((section, ours)), by.get((section, ref))
        return None if a is None or b is None else b["median_step_seconds"] / a["median_step_seconds"]

    def memory(section: str, ours: str, ref: str) -> float | None:
        a, b = by.get((section, ours)), by.get((section, ref))
        if a is None or b is None or a["peak_reserved_gib"] is None or not b["peak_reserved_gib"]:
            return None
        return float(a["peak_reserved_gib"] / b["peak_reserved_gib"])

    out: dict[str, float | None] = {}
    for ours in ("miniverl_fast", "miniverl_fast_bf16", "miniverl_lean"):
        out[f"step_speed_{ours}_vs_miniverl_hf"] = speed("step", ours, "miniverl_hf")
        out[f"step_speed_{ours}_vs_trl"] = speed("step", ours, "trl")
        out[f"step_memory_{ours}_vs_trl"] = memory("step", ours, "trl")
    for ours in ("miniverl_update", "miniverl_update_bf16"):
        out[f"update_speed_{ours}_vs_naive_hf_peft"] = speed("update", ours, "naive_hf_peft")
        out[f"update_memory_{ours}_vs_naive_hf_peft"] = memory("update", ours, "naive_hf_peft")
    return out


def validate_options(opts: GrpoBenchOptions) -> None:
    if opts.model not in GRPO_MODELS:
        raise UsageError(f"unknown model {opts.model!r}; choose one of {', '.join(GRPO_MODELS)}")
    unknown = [p for p in opts.paths if p not in STEP_PATHS] + [p for p in opts.update_paths if p not in UPDATE_PATHS]
    if unknown:
        raise UsageError(
            f"unknown path(s) {', '.join(unknown)}; step paths: {', '.join(STEP_PATHS)}; "
            f"update paths: {', '.join(UPDATE_PATHS)}"
        )
    for name in ("prompts", "samples", "new_tokens", "prompt_tokens", "rollout_batch", "repeats"):
        if getattr(opts, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}")
    if opts.warmup < 0 or opts.activation_checkpointing < 0:
        raise UsageError("--warmup and --activation-checkpointing must be >= 0")
    budget = opts.memory_budget_gib
    if isinstance(budget, str) and budget != "trl":
        raise UsageError(f"--memory-budget-gib must be a number of GiB or 'trl', got {budget!r}")
    if isinstance(budget, str) and "trl" not in opts.paths:
        raise UsageError("--memory-budget-gib trl needs the trl path in --paths")
    if isinstance(budget, float | int) and not budget > 0:
        raise UsageError(f"--memory-budget-gib must be > 0, got {budget}")
    batch, length = opts.update_shape
    if batch < 1 or length < 4:
        raise UsageError(f"--update-shape {batch},{length}: give B >= 1 and T >= 4")


def options_from_args(args: argparse.Namespace) -> GrpoBenchOptions:
    """The options of a parsed command line (:func:`run_grpo_bench` validates them, for every caller)."""
    return GrpoBenchOptions(
        model=args.model, device=args.device, dtype=args.dtype, prompts=args.prompts, samples=args.samples,
        new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, rollout_batch=args.rollout_batch,
        warmup=args.warmup, repeats=args.repeats, paths=args.paths, update_paths=args.update_paths,
        update_shape=args.update_shape, activation_checkpointing=args.activation_checkpointing,
        memory_budget_gib=getattr(args, "memory_budget_gib", None),
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from miniverl.bench.grpo_render import render_grpo_markdown

    parser = argparse.ArgumentParser(prog="miniverl bench grpo", description=(__doc__ or "").splitlines()[0])
    add_grpo_arguments(parser)
    args = parser.parse_args(argv)
    try:
        report = run_grpo_bench(options_from_args(args), args.out)
    except UsageError as exc:
        sys.stderr.write(f"miniverl: error: {exc}\n")
        return 2
    sys.stdout.write(render_grpo_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
