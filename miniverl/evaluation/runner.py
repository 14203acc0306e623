"""``miniverl eval RUN|ADAPTER --data prompts.parquet``: the trained adapter against its base (adapter off).

The source is a run directory (its plan gives the model, rewards and decoding; the adapter is a
verified checkpoint) or a PEFT adapter directory (``--config`` gives them: a plan.json or a config
YAML; an adapter exported by ``miniverl export`` must match the plan's digest when a plan is given).
Both decodings go through :mod:`miniverl.rollout` with the same seeds for base and trained:
greedy (one response per prompt) and, unless ``samples`` is 0, ``samples`` sampled responses.
"""

from __future__ import annotations

import gc
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miniverl import bounded
from miniverl.config.schema import MiniverlConfig
from miniverl.errors import UsageError
from miniverl.evaluation.scoring import Decoding, Summary, difference, generate, summarize

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
EXPORT_MANIFEST = "miniverl-manifest.json"


@dataclass
class Source:
    kind: str  # "run" | "adapter"
    config: MiniverlConfig
    plan_digest: str | None
    models: dict[str, dict[str, Any]]
    params: dict[str, Any]  # student LoRA tensors keyed by PEFT's saved names (no adapter name)
    step: int | None


def _peft_key(name: str) -> str:
    """A runtime parameter name without its adapter name (the keys a saved PEFT adapter uses)."""
    return re.sub(r"\.(lora_[AB]|lora_embedding_[AB])\.[^.]+\.", r".\1.", name)


def _load_config(path: Path) -> tuple[MiniverlConfig, str | None, dict[str, dict[str, Any]]]:
    if path.suffix == ".json":
        from miniverl.config.plan import load_plan

        plan, config = load_plan(path, verify_data=False)
        return config, plan.plan_digest, plan.models
    from miniverl.config.loader import load_config

    return load_config(path), None, {}


def resolve_source(source: Path, config_path: Path | None, step: int | None) -> Source:
    if (source / "run.json").is_file():
        from miniverl.artifacts.rundir import read_plan
        from miniverl.config.loader import validate_config
        from miniverl.training.checkpoint import read_checkpoint
        from miniverl.training.checkpoint_files import list_checkpoints, verify_checkpoint

        plan = read_plan(source)
        config = validate_config(dict(plan.config), origin=str(source / "plan.json"))
        if config_path is not None:
            config = _load_config(config_path)[0]
        candidates = list_checkpoints(source / "checkpoints")
        if step is not None:
            candidates = [c for c in candidates if c.name == f"step-{step:06d}"]
        if not candidates:
            raise UsageError(f"{source} has no checkpoint{'' if step is None else f' for step {step}'} to evaluate")
        record = verify_checkpoint(candidates[-1])
        params, _, _ = read_checkpoint(candidates[-1])
        keyed = {_peft_key(k): v for k, v in params.items()}
        return Source("run", config, plan.plan_digest, plan.models, keyed, record.step)
    if all((source / name).is_file() for name in ADAPTER_FILES):
        if config_path is None:
            raise UsageError(f"{source} is an adapter directory: give --config (its plan.json or config YAML)")
        config, digest, models = _load_config(config_path)
        _check_provenance(source, digest)
        _check_lora(source, config)
        from safetensors.torch import load_file

        weights = source / "adapter_model.safetensors"
        bounded.check_regular(weights, limit=bounded.WEIGHTS_MAX_BYTES, what="an adapter's weights")
        return Source("adapter", config, digest, models, load_file(weights), None)
    raise UsageError(f"{source} is neither a run directory (run.json) nor a PEFT adapter directory")


def _json_object(path: Path, what: str) -> dict[str, Any]:
    """A JSON object from an adapter directory, read bounded: one line (exit 2) for anything else."""
    try:
        value = bounded.read_json(path, limit=bounded.MODEL_CONFIG_MAX_BYTES, what=what)
    except ValueError as exc:  # not UTF-8, malformed, duplicate keys
        raise UsageError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{path} is not a JSON object")
    return value


def _check_provenance(adapter: Path, plan_digest: str | None) -> None:
    manifest = adapter / EXPORT_MANIFEST
    if plan_digest is None or not manifest.is_file():
        return
    exported = _json_object(manifest, "an export manifest")
    provenance = exported.get("adapter_provenance")
    made_by = provenance.get("plan_digest") if isinstance(provenance, dict) else None
    if made_by is not None and made_by != plan_digest:
        raise UsageError(
            f"{adapter} was exported from plan {str(made_by)[:16]}, not the --config plan {plan_digest[:16]}; "
            "give the plan of the run that produced it (or a config YAML)"
        )


def _check_lora(adapter: Path, config: MiniverlConfig) -> None:
    saved = _json_object(adapter / "adapter_config.json", "an adapter config")
    lora = config.models.student.lora
    if lora is None or not lora.enabled:
        raise UsageError("--config has no student LoRA (models.student.lora), so it cannot host this adapter")
    if saved.get("r") != lora.r or float(saved.get("lora_alpha", -1)) != float(lora.alpha):
        raise UsageError(
            f"{adapter} has LoRA r={saved.get('r')} alpha={saved.get('lora_alpha')}, the config r={lora.r} "
            f"alpha={lora.alpha}; give the config the adapter was trained with"
        )


def evaluate(
    source_path: Path,
    data: Path,
    *,
    config_path: Path | None = None,
    step: int | None = None,
    samples: int = 4,
    seed: int | None = None,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
    columns: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``columns`` (``eval --columns``): the eval file's field -> column mapping; default the run's data.columns."""
    from miniverl.data import describe_dataset, load_prompts

    if samples < 0:
        raise UsageError(f"--samples {samples}: give 0 (greedy only) or more")
    source = resolve_source(source_path, config_path, step)
    config = source.config
    # the run's data.columns name the eval file's columns too, unless --columns names them (the messages name
    # --columns: the option a user can change for an existing run's eval)
    mapping = config.data.columns if columns is None else columns
    described = describe_dataset(data, mapping, mapped_by="eval")
    rows = load_prompts(data, mapping, mapped_by="eval")
    r = config.rollout
    seed = config.run.seed if seed is None else seed
    greedy = Decoding.greedy_of(r, seed)
    if max_new_tokens is not None:
        greedy = Decoding(**{**greedy.__dict__, "max_new_tokens": max_new_tokens})
    sampled = Decoding(
        samples,
        r.temperature if temperature is None else temperature,
        r.top_p,
        r.top_k,
        greedy.max_new_tokens,
        r.batch_size,
        seed,
        r.use_chat_template,
    )
    modes = {"greedy": greedy, **({"sampled": sampled} if samples else {})}
    started = time.perf_counter()
    results = _run_modes(source, rows, modes)
    return {
        "source": {
            "kind": source.kind,
            "path": str(source_path),
            "step": source.step,
            "plan_digest": source.plan_digest,
        },
        "data": {"path": str(data), "sha256": described["sha256"], "rows": described["rows"]},
        "rewards": [t.name for t in config.algorithm.rewards],
        "settings": {name: dict(d.__dict__) for name, d in modes.items()},
        **results,
        "seconds": time.perf_counter() - started,
    }


def _run_modes(source: Source, rows: list[Any], modes: dict[str, Decoding]) -> dict[str, dict[str, Summary]]:
    import torch

    from miniverl import progress
    from miniverl.models.loading import resolve_device
    from miniverl.rewards.reward_model import MixedReward, RewardModel
    from miniverl.runtime import build_runtime

    config = source.config
    device = resolve_device(config.models.device)
    student_only = config.models.model_copy(
        update={"runtime": "dual_model", "teacher": None, "reference": None, "critic": None}
    )
    progress.phase("load", f"student for eval on {device}")
    runtime = build_runtime(student_only, device=device)
    reward = None
    try:
        named = dict(runtime.named_trainable_parameters())
        by_key = {_peft_key(k): p for k, p in named.items()}
        if set(by_key) != set(source.params):
            raise UsageError("the adapter's tensors do not match the config's LoRA layout (targets or layers)")
        with torch.no_grad():
            for key, param in by_key.items():
                tensor = source.params[key]
                if tuple(tensor.shape) != tuple(param.shape):
                    raise UsageError(f"adapter tensor {key} has shape {tuple(tensor.shape)}, not {tuple(param.shape)}")
                param.copy_(tensor.to(param.device, param.dtype))
        rm = None
        if config.models.reward is not None:
            rm = RewardModel(
                config.models.reward,
                device=device,
                student_tokenizer=runtime.tokenizer,
                expected_identity=source.models.get("reward"),
            )
        reward = MixedReward(config.algorithm.rewards, rm)
        out: dict[str, dict[str, Summary]] = {}
        counter = _Responses(sum(2 * len(rows) * d.samples for d in modes.values()))
        for name, decoding in modes.items():
            found: dict[str, Summary] = {}
            for which in ("base", "trained"):
                with runtime.generation_model() as model, _adapter_off(model, which == "base"):
                    trajectories = []
                    for chunk in _chunks(rows, decoding):
                        trajectories += generate(model, runtime.tokenizer, chunk, decoding, version=0)
                        counter.add(len(chunk) * decoding.samples, f"eval {name} {which}")
                found[which] = summarize(trajectories, reward.score_batch(rows, trajectories))
            out[name] = {**found, "difference": difference(found["base"], found["trained"])}
        return out
    finally:
        if reward is not None:
            reward.close()
        runtime.close()
        del runtime
        gc.collect()


class _Responses:
    """Progress over every response an eval decodes (both models, every mode), for one ETA over the whole eval."""

    def __init__(self, total: int) -> None:
        from miniverl import progress

        self.done = 0
        progress.task("eval", total, "responses")

    def add(self, count: int, label: str) -> None:
        from miniverl import progress

        self.done += count
        progress.advance(self.done, label)


def _chunks(rows: list[Any], decoding: Decoding) -> list[list[Any]]:
    """``rows`` in pieces for progress, each filling whole decode batches, so the decoder's batches are those of
    one call over every row (a sample's stream depends on its prompt_id and index alone, not on its batch)."""
    size = max(1, decoding.batch_size // math.gcd(decoding.batch_size, decoding.samples))
    return [rows[start : start + size] for start in range(0, len(rows), size)]


class _adapter_off:
    """PEFT's ``disable_adapter()`` when ``off``: the base model alone; a no-op otherwise."""

    def __init__(self, model: Any, off: bool) -> None:
        self.context = model.disable_adapter() if off else None

    def __enter__(self) -> None:
        if self.context is not None:
            self.context.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.context is not None:
            self.context.__exit__(*exc)


def render_table(result: dict[str, Any]) -> str:
    src = result["source"]
    where = f"{src['path']}" + (f" step {src['step']}" if src["step"] is not None else "")
    table: list[tuple[str, str, Any, Any, Any]] = []
    for mode in ("greedy", "sampled"):
        if mode not in result:
            continue
        base, trained, diff = (result[mode][k] for k in ("base", "trained", "difference"))
        table.append((mode, "reward (total)", base["reward_mean"], trained["reward_mean"], diff["reward_mean"]))
        for name, values in trained["components"].items():
            for key, label in (("mean", "mean"), ("fraction_positive", "accuracy (> 0)")):
                if key == "fraction_positive" and values[key] is None:
                    continue
                was = base["components"].get(name, {}).get(key)
                table.append((mode, f"{name} {label}", was, values[key], diff["components"][name][key]))
        tokens = ("response_tokens_mean",) * 3
        table.append(
            (mode, "response tokens", *(part[k] for part, k in zip((base, trained, diff), tokens, strict=True)))
        )
    width = max([len("metric"), *(len(row[1]) for row in table)])

    def cell(value: Any, signed: bool = False) -> str:
        return f"{'-':>9}" if value is None else (f"{value:>+9.3f}" if signed else f"{value:>9.3f}")

    lines = [
        f"eval of {where} on {result['data']['path']} ({result['data']['rows']} prompts), "
        f"rewards {', '.join(result['rewards'])}, {result['seconds']:.1f}s",
        f"{'mode':<8} {'metric':<{width}} {'base':>9} {'trained':>9} {'diff':>9}",
    ]
    for mode, label, b, t, d in table:
        lines.append(f"{mode:<8} {label:<{width}} {cell(b)} {cell(t)} {cell(d, True)}")
    if result.get("written"):
        lines.append(f"kept in {result['written']} (`miniverl report` shows it)")
    return "\n".join(lines)
