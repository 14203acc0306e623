"""Compile a config plus overrides into ``plan.json``. Loads no weights and never imports torch."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic import ValidationError

from miniverl import __version__, bounded
from miniverl.canonical import sha256_file, sha256_json
from miniverl.config.checks import check_config, check_data
from miniverl.config.loader import apply_overrides, read_yaml, validate_config, validation_message
from miniverl.config.schema import MiniverlConfig, ModelSpec
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import ConfigError, DataError, UsageError
from miniverl.records import DataBinding, DirectConfig, PlacementPlan, PlanExtension, PlanRecord
from miniverl.runtime.memory_shapes import NF4_BYTES_PER_PARAM, DecoderDims

BYTES_PER_PARAM = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "nf4": NF4_BYTES_PER_PARAM}


def compile_plan(config_path: Path, overrides: list[str]) -> PlanRecord:
    data = apply_overrides(read_yaml(config_path), list(overrides))
    config = validate_config(data, origin=str(config_path))
    return build_plan(config, overrides)


def build_plan(
    config: MiniverlConfig, overrides: list[str], *, direct_config: DirectConfig | None = None
) -> PlanRecord:
    from miniverl.data import describe_dataset, load_prompts

    check_config(config)
    _check_context(config)
    resolved_config = config.model_dump(mode="json")
    described = describe_dataset(Path(config.data.path), config.data.columns)
    check_data(config, load_prompts(config.data.path, config.data.columns))
    models = {role: _identity(spec, config) for role, spec in _roles(config).items()}
    if config.models.reward is not None:
        from miniverl.rewards.reward_model import reward_model_identity

        models["reward"] = reward_model_identity(config.models.reward, fetch=False)[0]
    updates = config.train.cycles
    eval_data = _eval_binding(config)
    body: dict[str, Any] = {
        "miniverl_version": __version__,
        "config": resolved_config,
        "overrides": list(overrides),
        "config_digest": sha256_json(resolved_config),
        "data": DataBinding(path=config.data.path, sha256=described["sha256"], rows=described["rows"]),
        "models": models,
        "placement": _placement(config),
        "cycles": config.train.cycles,
        "trajectories_per_cycle": config.trajectories_per_cycle,
        "updates": updates,
        "eval_data": eval_data,
    }
    if direct_config is not None:  # compiler v4: the native verl YAML and its runtime bindings
        body["direct_config"] = direct_config
    return _with_handoff(body, config)


def _with_handoff(body: dict[str, Any], config: MiniverlConfig) -> PlanRecord:
    """The signed plan with its ``handoff`` section (computed from the plan without it: no cycle)."""
    from miniverl.handoff.plan_section import handoff_section

    body = {k: v for k, v in body.items() if k != "handoff"}
    section = handoff_section(_signed(body), config)
    return _signed({**body, "handoff": section})


def _signed(body: dict[str, Any]) -> PlanRecord:
    unsigned = PlanRecord.model_construct(**body, plan_digest="0" * 64).model_dump(mode="json")
    unsigned.pop("plan_digest")
    return PlanRecord(**body, plan_digest=sha256_json(unsigned))


def _eval_binding(config: MiniverlConfig) -> DataBinding | None:
    """``data.eval_path`` bound by content; ``algorithm.eval_every`` needs it and an on-policy algorithm."""
    from miniverl.data import describe_dataset, load_prompts

    every, path = config.algorithm.eval_every, config.data.eval_path
    if every is not None and path is None:
        raise ConfigError("algorithm.eval_every needs data.eval_path (held-out prompts: .parquet, .jsonl or .csv)")
    if every is not None and config.algorithm.name in ("sft", "kd"):
        raise ConfigError(f"algorithm.eval_every scores with the run's rewards; {config.algorithm.name} has none")
    if path is None:
        return None
    described = describe_dataset(Path(path), config.data.columns)
    load_prompts(path, config.data.columns)
    return DataBinding(path=path, sha256=described["sha256"], rows=described["rows"])


def extend_plan(plan: PlanRecord, added: int) -> PlanRecord:
    """``plan`` with ``added`` more cycles: the same config but ``train.cycles``, and one lineage entry more."""
    if added < 1:
        raise UsageError(f"--extend {added}: give a number of cycles >= 1")
    raw = dict(plan.config)
    raw["train"] = {**dict(raw["train"]), "cycles": plan.cycles + added}
    config = validate_config(raw, origin="the extended plan")
    resolved = config.model_dump(mode="json")
    # every field as it is (sub-records stay records), except what the extension changes
    body: dict[str, Any] = {name: getattr(plan, name) for name in PlanRecord.model_fields if name != "plan_digest"}
    body.update(
        config=resolved,
        config_digest=sha256_json(resolved),
        cycles=config.train.cycles,
        updates=config.train.cycles,
        lineage=[
            *plan.lineage,
            PlanExtension(previous_plan_digest=plan.plan_digest, previous_cycles=plan.cycles, added_cycles=added),
        ],
    )
    return _with_handoff(body, config) if plan.handoff is not None else _signed(body)


def plan_ancestry(plan: PlanRecord, plans_dir: Path) -> list[str]:
    """The digests of ``plan`` and of every plan it extends (newest first), each proven from its file.

    Every ``lineage`` entry must name a plan kept as ``plans_dir/<digest>.json`` whose own digest
    verifies and whose extension by ``added_cycles`` is exactly the next plan.
    """
    chain = [plan.plan_digest]
    current = plan
    while current.lineage:
        link = current.lineage[-1]
        path = plans_dir / f"{link.previous_plan_digest}.json"
        try:
            previous, _ = load_plan(path, verify_data=False)
        except ConfigError:
            raise ConfigError(
                f"plan {current.plan_digest[:16]} extends {link.previous_plan_digest[:16]}, "
                f"but {path} is missing or invalid; the lineage cannot be proven"
            ) from None
        if extend_plan(previous, link.added_cycles).plan_digest != current.plan_digest:
            raise ConfigError(
                f"plan {current.plan_digest[:16]} is not {previous.plan_digest[:16]} extended by "
                f"{link.added_cycles} cycle(s); the lineage does not verify"
            )
        chain.append(previous.plan_digest)
        current = previous
    return chain


def plan_digest_of(record: dict[str, Any]) -> str:
    unsigned = {k: v for k, v in record.items() if k != "plan_digest"}
    return sha256_json(unsigned)


def load_plan(path: Path, *, verify_data: bool = True) -> tuple[PlanRecord, MiniverlConfig]:
    """Read ``plan.json``, re-verify its digest and (by default) the data file's sha256."""
    try:
        raw = loads_json(bounded.read_text(path, limit=bounded.PLAN_MAX_BYTES, what="a plan"))
    except FileNotFoundError:
        raise ConfigError(f"plan not found: {path}; create it with `miniverl plan CONFIG --out {path}`") from None
    except IsADirectoryError:
        raise ConfigError(f"plan {path} is a directory; give the plan.json file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"plan {path} is not UTF-8 text") from None
    except StrictFormatError as exc:
        raise ConfigError(f"plan {path} is refused: {exc}; re-create it with `miniverl plan`") from None
    except OSError as exc:
        raise ConfigError(f"cannot read plan {path}: {exc.strerror or exc.__class__.__name__}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"plan {path} must be a JSON object")
    try:
        plan = PlanRecord.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"invalid plan {path}: {validation_message(exc)}") from None
    if plan_digest_of(raw) != plan.plan_digest:
        raise ConfigError(f"plan {path} was modified after `miniverl plan` (plan_digest mismatch); re-run plan")
    config = validate_config(dict(plan.config), origin=str(path))
    if sha256_json(config.model_dump(mode="json")) != plan.config_digest:
        raise ConfigError(f"plan {path}: config_digest does not match its config; re-run plan")
    check_config(config)
    if verify_data:
        data_path = Path(plan.data.path)
        if not data_path.is_file():
            raise DataError(f"data file not found: {plan.data.path} (bound by the plan)")
        if sha256_file(data_path) != plan.data.sha256:
            raise DataError(f"data file {plan.data.path} changed since `miniverl plan` (sha256 mismatch); re-run plan")
        if plan.eval_data is not None:
            eval_path = Path(plan.eval_data.path)
            if not eval_path.is_file() or sha256_file(eval_path) != plan.eval_data.sha256:
                raise DataError(f"eval data {plan.eval_data.path} is missing or changed since `miniverl plan`")
    return plan, config


def _roles(config: MiniverlConfig) -> dict[str, ModelSpec]:
    roles: dict[str, ModelSpec] = {"student": config.models.student}
    if config.models.teacher is not None:
        roles["teacher"] = config.models.teacher
    if config.models.reference is not None:
        roles["reference"] = config.models.reference
    if config.models.critic is not None:
        roles["critic"] = config.models.critic
    return roles


def _check_context(config: MiniverlConfig) -> None:
    """``rollout.max_new_tokens`` leaves room for a prompt in the student's context, where its config is known."""
    from miniverl.models.sources import resolve

    context = (resolve(config.models.student, fetch=False).config or {}).get("max_position_embeddings")
    if isinstance(context, int) and not isinstance(context, bool) and config.rollout.max_new_tokens >= context:
        raise ConfigError(
            f"rollout.max_new_tokens {config.rollout.max_new_tokens} exceeds the limit of {context - 1} for this "
            f"student: its context is {context} tokens (max_position_embeddings), prompt included"
        )


def _identity(spec: ModelSpec, config: MiniverlConfig) -> dict[str, Any]:
    from miniverl.models.sources import plan_identity

    identity = plan_identity(spec, student=config.models.student)
    if spec.privileged_context is not None:
        identity = {**identity, "privileged_context": spec.privileged_context.model_dump(mode="json")}
    return identity


def _placement(config: MiniverlConfig) -> PlacementPlan:
    from miniverl.models.sources import plan_architecture

    student = config.models.student
    arch = plan_architecture(student)
    models = config.models
    if models.runtime == "shared_backbone":
        physical = 1
    else:
        physical = 1 + sum(spec is not None for spec in (models.teacher, models.reference, models.critic))
    precision = "nf4" if student.quantization == "nf4" else models.dtype
    weight_bytes = trainable = optimizer = None
    basis = "no architecture known before fetching; measured at run time"
    if arch is not None:
        weight_bytes = estimated_weight_bytes(arch, models.dtype, quantized=precision == "nf4", physical=physical)
        lora = student.lora
        if lora is not None and lora.enabled:
            trainable = _decoder_dims(arch).lora_params(lora.r, lora.target_modules)
            optimizer = trainable * 4 * 3
        basis = "config.json parameter count x bytes per parameter x physical models; LoRA from shapes"
        if precision == "nf4":
            basis += "; NF4: the student's decoder linears in 4 bits, the rest in models.dtype"
    return PlacementPlan(
        device=models.device,
        runtime=models.runtime,
        physical_models=physical,
        dtype=models.dtype,
        quantization=student.quantization,
        estimated_weight_bytes=weight_bytes,
        estimated_trainable_params=trainable,
        estimated_optimizer_bytes=optimizer,
        basis=basis,
    )


def estimated_weight_bytes(arch: dict[str, Any], dtype: str, *, quantized: bool, physical: int) -> int:
    """The weights of ``physical`` models of this architecture in ``dtype``; ``quantized``: the student's NF4 load
    quantizes its decoder linears only (embeddings, LM head and norms stay in ``dtype``), the other models are
    ``dtype`` throughout."""
    element = BYTES_PER_PARAM[dtype]
    saving = _decoder_dims(arch).linear_params() * (element - BYTES_PER_PARAM["nf4"]) if quantized else 0.0
    return int(int(arch["param_count"]) * element * physical - saving)


def _decoder_dims(arch: dict[str, Any]) -> DecoderDims:
    """The memory plan's shapes, read from ``describe_architecture``'s keys (the same names as a config.json's)."""
    return DecoderDims.from_hf_config(SimpleNamespace(**arch))
