"""Compiler ``verl-rl-v0.9-single-gpu-v4`` (direct-config): a native verl 0.9 YAML -> a miniverl plan.

``miniverl plan --verl-config native.yaml [--set KEY=VALUE ...] [--bindings FILE]`` reads the native
file's exact bytes, maps every key through :data:`~miniverl.handoff.native_rules.RULES` (unknown
keys and keys whose value miniverl cannot compute the same way are refused by name), takes the
placement choices from the user's runtime bindings (never from an edit of the native file) and
builds an ordinary plan that also carries the native bytes, their sha256, the bindings and the
import digests (``direct_config``). ``handoff`` compares the bundle's config with the native file
key by key (:func:`native_diff`).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import yaml

from miniverl import bounded
from miniverl.canonical import sha256_json
from miniverl.config.schema import BUILTIN_MODELS
from miniverl.config.strict import StrictFormatError, loads_yaml
from miniverl.errors import UsageError
from miniverl.handoff.ir import COMPILER_V4
from miniverl.handoff.native_rules import (
    BINDINGS,
    IGNORED_KEYS,
    INTERPOLATED,
    KL_GATED,
    RULES,
    RUNTIME_KEYS,
    Estimator,
    ImportRule,
    import_rules_digest,
    rules_by_key,
)
from miniverl.handoff.rules import HandoffRefusal, refuse
from miniverl.records import DirectConfig, NativeSource, PlanRecord

PRECISIONS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
HUB_PIN = re.compile(r"^(?P<id>[^@\s]+)@(?P<rev>[0-9a-f]{40})$")
LEAF_KEYS = frozenset({"reward.custom_reward_function.reward_kwargs.miniverl_rewards"})
#: maps whose absence is allowed: the KL keys only matter when a KL switch is on (and a switch that is absent is
#: off in verl, as in miniverl); critic.enable absent is decided by the estimator; the critic's epochs and
#: mini-batch size default to the actor's in verl (interpolation) and in miniverl (None); use_liger absent is off in
#: both (verl's False, miniverl's fused_kernels none)
OPTIONAL = frozenset(
    {
        "kl_coef",
        "kl_est",
        "kl_loss",
        "kl_reward",
        "critic_enable",
        "critic_epochs",
        "critic_mini_batches",
        "liger_switch",
    }
)
#: maps whose value is set by a function of several keys (KL, the critic switch, the precision checks)
DERIVED = frozenset({"kl_loss", "kl_reward", "kl_coef", "kl_est", "dtype", "do_sample", "critic_enable"})
ESTIMATORS: dict[Any, Estimator] = {"grpo": "grpo", "gae": "ppo"}
#: verl kl_penalty / kl_loss_type names computed by miniverl under the same name and formula
KL_ESTIMATORS = ("k1", "k2", "low_var_kl")
#: verl's other names for those formulas (verl 0.9.1's kl_penalty_forward): kl = k1, mse = k2, and k3 = its clamped
#: low_var_kl, which is miniverl's low_var_kl (miniverl's own k3 is unclamped: never the import of verl's k3)
KL_ALIASES = {"kl": "k1", "mse": "k2", "k3": "low_var_kl"}
#: native keys holding a KL estimator name: the bundle states the miniverl name of the same formula
KL_NAME_KEYS = frozenset({"actor_rollout_ref.actor.kl_loss_type", "algorithm.kl_penalty"})
STATUSES = (
    "same",
    "default",
    "derived",
    "runtime",
    "ignored",
    "extended",
    "changed",
    "native_only",
    "bundle_only",
)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of nested mappings; lists and scalars are leaves."""
    if isinstance(data, dict) and prefix not in LEAF_KEYS and (data or not prefix):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out |= flatten(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    return {prefix: data}


def _refused(code: str, message: str) -> HandoffRefusal:
    return HandoffRefusal(code, f"{message} [{COMPILER_V4}]")


def read_native(path: Path) -> tuple[bytes, dict[str, Any]]:
    try:
        raw = bounded.read_bytes(path, limit=bounded.CONFIG_MAX_BYTES, what="a native verl config")
    except OSError as exc:
        raise UsageError(f"cannot read native verl config {path}: {exc.strerror or exc.__class__.__name__}") from None
    try:
        data = loads_yaml(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise _refused("native_not_yaml", f"{path} is not UTF-8 YAML ({exc.__class__.__name__})") from None
    except StrictFormatError as exc:  # a duplicate key, an alias bomb, deep nesting, a lone surrogate
        raise bounded.InputBoundError(f"{path}: {exc}") from None
    bounded.check_depth(data, origin=str(path))
    if not isinstance(data, dict):
        raise _refused("native_not_yaml", f"{path} must hold a mapping (verl's ppo_trainer layout)")
    return raw, data


def _load_bindings(path: Path) -> Any:
    try:
        text = bounded.read_text(path, limit=bounded.CONFIG_MAX_BYTES, what="a bindings file")
    except FileNotFoundError:
        raise UsageError(f"bindings file not found: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"bindings file {path} is a directory; give a YAML file") from None
    except UnicodeDecodeError:
        raise UsageError(f"bindings file {path} is not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"cannot read bindings file {path}: {exc.strerror or exc.__class__.__name__}") from None
    try:
        loaded = loads_yaml(text)
    except yaml.YAMLError:
        raise UsageError(f"bindings file {path} is not valid YAML") from None
    except StrictFormatError as exc:
        raise bounded.InputBoundError(f"{path}: {exc}") from None
    return bounded.check_depth(loaded, origin=str(path))


def parse_bindings(sets: list[str], bindings_file: Path | None) -> dict[str, Any]:
    """The runtime bindings: a small YAML file, then ``--set KEY=VALUE`` (only the keys of BINDINGS)."""
    bindings: dict[str, Any] = {}
    if bindings_file is not None:
        loaded = _load_bindings(bindings_file) or {}
        if not isinstance(loaded, dict):
            raise UsageError(f"bindings file {bindings_file} must hold a mapping")
        bindings |= loaded
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE")
        try:
            bindings[key.strip()] = loads_yaml(value)
        except (yaml.YAMLError, StrictFormatError):
            raise UsageError(f"--set {item!r}: the value is not a valid YAML scalar") from None
    unknown = sorted(set(bindings) - set(BINDINGS))
    if unknown:
        raise _refused(
            "not_a_runtime_binding",
            f"{', '.join(unknown)}: with --verl-config only runtime bindings can be set "
            f"({', '.join(BINDINGS)}); the experiment's keys come from the native file, which is never edited",
        )
    if "model" not in bindings:
        raise _refused("model_binding_missing", "set model=<local dir | hub-id@40-hex | builtin name>")
    bindings["model"] = portable_model(bindings["model"])
    return bindings


def portable_model(model: Any) -> Any:
    """A local model directory as a path relative to the working directory, like ``data.path``.

    The plan and the run record the binding; records never hold a path of the machine that wrote
    them, so an absolute directory is written relative to where ``miniverl plan`` runs.
    """
    text = str(model)
    if Path(text).is_absolute() and Path(text).is_dir():
        return os.path.relpath(text)
    return model


def student_from_binding(model: Any) -> dict[str, Any]:
    text = str(model)
    if text in BUILTIN_MODELS:
        return {"source": "builtin", "model_id": text}
    pinned = HUB_PIN.match(text)
    if pinned:
        return {"source": "hub", "model_id": pinned["id"], "revision": pinned["rev"]}
    if Path(text).is_dir():
        return {"source": "local", "path": str(portable_model(text))}
    raise _refused(
        "model_unresolvable",
        f"model {text!r} is neither a local directory, a hub id@40-hex revision nor a builtin model "
        f"({', '.join(BUILTIN_MODELS)})",
    )


def _set(config: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def estimator_of(flat: dict[str, Any]) -> Estimator:
    """The miniverl algorithm of a native file: ``grpo`` (adv_estimator grpo) or ``ppo`` (gae, with a critic)."""
    value = flat.get("algorithm.adv_estimator")
    if value is None:
        raise _refused(
            "native_key_missing", "algorithm.adv_estimator is absent (verl's default gae would apply unseen)"
        )
    if not isinstance(value, str) or value not in ESTIMATORS:
        raise _refused("native_adv_estimator", f"algorithm.adv_estimator {value!r}: v4 imports grpo and gae")
    estimator = ESTIMATORS[value]
    enabled = flat.get("critic.enable")
    if enabled is not None and enabled is not (estimator == "ppo"):
        raise _refused(
            "native_critic_enable",
            f"critic.enable {enabled!r} with adv_estimator {value}: miniverl's PPO (gae) always trains its critic "
            "and its GRPO has none",
        )
    return estimator


def _check_rule(rule: ImportRule, flat: dict[str, Any], value: Any) -> None:
    if rule.action == "expect" and value != rule.value and value not in rule.also:
        wanted = " or ".join(repr(allowed) for allowed in (rule.value, *rule.also))
        raise _refused(str(rule.code), f"{rule.key}: {value!r} (miniverl needs {wanted}): {rule.reason}")
    if rule.action == "same" and rule.field in flat and not _same(value, flat[rule.field]):
        absent = " (absent: verl's default)" if rule.key not in flat else ""
        raise _refused(
            str(rule.code), f"{rule.key} {value!r}{absent} != {rule.field} {flat[rule.field]!r}: {rule.reason}"
        )


def _whole(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refused("native_not_a_count", f"{key} {value!r}: a whole number is needed")
    return value


def _mini_batches(key: str, value: Any, flat: dict[str, Any]) -> int:
    prompts, size = _whole("data.train_batch_size", flat["data.train_batch_size"]), _whole(key, value)
    if size < 1 or size > prompts or prompts % size:
        raise _refused(
            "mini_batch_splits_groups",
            f"{key} {value!r} does not divide data.train_batch_size {prompts}: verl's mini-batches are whole "
            "prompt groups and miniverl's mini-batches are equal shares of the step",
        )
    return prompts // size


def _convert(rule: ImportRule, value: Any, flat: dict[str, Any]) -> Any:
    to = rule.to
    if to == "estimator":
        return ESTIMATORS[value]
    if to in ("mini_batches", "critic_mini_batches"):
        return _mini_batches(rule.key, value, flat)
    if to == "liger_switch":
        if not isinstance(value, bool):
            raise _refused("native_use_liger", f"{rule.key} {value!r}: true or false")
        return "liger" if value else "none"
    if to == "critic_epochs":
        return _whole(rule.key, value)
    if to == "critic_rank":
        if _whole(rule.key, value) == 0:
            raise _refused(
                "critic_full_parameter",
                f"{rule.key}: 0 (a full-parameter critic): miniverl's critic is a LoRA plus a value head on the "
                "actor's base; a full-parameter critic (every weight of a second model trained, with its AdamW "
                "state) has no miniverl counterpart on one device. Give critic.model.lora_rank > 0",
            )
        return int(value)
    if to == "precision":
        if value not in PRECISIONS:
            raise _refused("native_precision", f"{rule.key} {value!r}: one of {', '.join(PRECISIONS)}")
        return PRECISIONS[value]
    if to == "top_k":
        return 0 if _whole(rule.key, value) == -1 else value
    if to == "kl_est":
        if not isinstance(value, str) or KL_ALIASES.get(value, value) not in KL_ESTIMATORS:
            raise _refused(
                "native_kl_estimator",
                f"{rule.key} {value!r}: miniverl computes verl's {', '.join(sorted(KL_ALIASES))} and "
                f"{', '.join(KL_ESTIMATORS)}; abs, full and the straight-through '+' forms have no counterpart",
            )
        return KL_ALIASES.get(value, value)
    return value


def _kl(flat: dict[str, Any]) -> dict[str, Any]:
    loss, in_reward = (
        bool(flat.get("actor_rollout_ref.actor.use_kl_loss")),
        bool(flat.get("algorithm.use_kl_in_reward")),
    )
    if loss and in_reward:
        raise _refused("native_two_kl_terms", "use_kl_loss and use_kl_in_reward are both on; miniverl has one KL term")
    if not (loss or in_reward):
        return {"kl_coef": 0.0}
    keys = (
        ("actor_rollout_ref.actor.kl_loss_coef", "actor_rollout_ref.actor.kl_loss_type")
        if loss
        else ("algorithm.kl_ctrl.kl_coef", "algorithm.kl_penalty")
    )
    for key in keys:
        if key not in flat:
            raise _refused("native_key_missing", f"{key} is needed with the KL term on")
    rule = rules_by_key()[keys[1]]
    estimator = _convert(rule, flat[keys[1]], flat)
    return {"kl_coef": float(flat[keys[0]]), "kl_mode": "loss" if loss else "reward", "kl_estimator": estimator}


def _lora(config: dict[str, Any], role: str, what: str) -> dict[str, Any]:
    lora = config["models"][role]["lora"]
    if not isinstance(lora["target_modules"], list):
        raise _refused("native_target_modules", f"{what}.target_modules must list module names (not 'all-linear')")
    return {**lora, "enabled": True, "dropout": 0.0}


def native_to_config(flat: dict[str, Any], bindings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The miniverl config (plain data) and the decision per native key."""
    table = rules_by_key()
    unknown = sorted(k for k in flat if k not in table)
    if unknown:
        raise _refused("unknown_native_key", f"{', '.join(unknown)}: no import rule (nothing is guessed)")
    algo = estimator_of(flat)
    # verl's GRPO epsilon is fixed at 1e-6; verl always whitens GAE advantages
    section: dict[str, Any] = {"eps": 1e-6} if algo == "grpo" else {"whiten_advantages": True}
    config: dict[str, Any] = {"run": {}, "models": {"student": {}}, "algorithm": {algo: section}}
    if algo == "ppo":
        config["models"]["critic"] = {"source": "student"}
    decisions: dict[str, str] = {}
    for rule in RULES:
        if rule.only is not None and rule.only != algo:
            if rule.key in flat:
                decisions[rule.key] = "unused"  # verl never reads it for this estimator
            continue
        if rule.key not in flat:
            if rule.action == "same" and rule.verl_default is not None:
                _check_rule(rule, flat, rule.verl_default)
            if rule.action == "map" and rule.to not in OPTIONAL:
                raise _refused("native_key_missing", f"{rule.key} is absent (verl's default would apply unseen)")
            continue
        decisions[rule.key] = rule.action + (f":{rule.target(algo)}" if rule.field and rule.action == "map" else "")
        _check_rule(rule, flat, flat[rule.key])
        if rule.action != "map" or rule.to in DERIVED:
            continue
        value = _convert(rule, flat[rule.key], flat)
        if rule.key == "data.train_files":
            value = _single_file(value)
        _set(config, rule.target(algo), value)
    kl = _kl(flat)
    _set(config, f"algorithm.{algo}", {**config["algorithm"][algo], **kl})
    models = config["models"]
    if kl["kl_coef"] > 0:  # verl's reference of a LoRA actor is its own base with the adapter disabled
        models["reference"] = {"source": "student"}
    rollout_dtype = flat.get("actor_rollout_ref.rollout.dtype")
    if rollout_dtype is not None and rollout_dtype != models["dtype"]:
        raise _refused("native_dtypes_differ", f"rollout.dtype {rollout_dtype!r} != model dtype {models['dtype']!r}")
    do_sample = flat.get("actor_rollout_ref.rollout.do_sample")
    if do_sample is not None and bool(do_sample) != (float(config["rollout"]["temperature"]) > 0):
        raise _refused("native_do_sample", f"do_sample {do_sample!r} disagrees with the temperature")
    if _whole("actor_rollout_ref.model.lora_rank", models["student"]["lora"]["r"]) == 0:
        raise refuse("lora_disabled", "actor_rollout_ref.model.lora_rank: 0")
    models["student"] = {
        **student_from_binding(bindings["model"]),
        "quantization": bindings.get("quantization", "none"),
        "lora": _lora(config, "student", "actor_rollout_ref.model"),
    }
    if algo == "ppo":
        models["critic"]["lora"] = _lora(config, "critic", "critic.model")
    models["device"] = bindings.get("device", "auto")
    config["train"]["trajectory_batch_size"] = bindings.get("trajectory_batch_size", "auto")
    if "batch_size" in bindings:
        config["rollout"]["batch_size"] = bindings["batch_size"]
    return config, decisions


def _single_file(value: Any) -> str:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str):
        raise _refused("native_data_files", f"data.train_files {value!r}: one miniverl prompts Parquet file")
    return value


def import_native(path: Path, sets: list[str], bindings_file: Path | None = None) -> PlanRecord:
    """``miniverl plan --verl-config PATH``: the plan (compiler v4) of a native verl YAML."""
    from miniverl.config.loader import validate_config
    from miniverl.config.plan import build_plan

    raw, data = read_native(path)
    bindings = parse_bindings(sets, bindings_file)
    flat = flatten(data)
    config_data, decisions = native_to_config(flat, bindings)
    config = validate_config(config_data, origin=f"{path} ({COMPILER_V4})")
    native_sha = hashlib.sha256(raw).hexdigest()
    direct = DirectConfig(
        compiler=COMPILER_V4,
        native=NativeSource(name=path.name, sha256=native_sha, bytes=len(raw), text=raw.decode("utf-8")),
        runtime_bindings=bindings,
        rules_digest=import_rules_digest(),
        import_digest=sha256_json({"native_sha256": native_sha, "decisions": decisions, "config": config_data}),
        decisions=decisions,
    )
    return build_plan(config, [], direct_config=direct)


def verified_native(direct: DirectConfig) -> bytes:
    """The native bytes of a plan, checked against their recorded sha256."""
    raw = direct.native.text.encode("utf-8")
    if hashlib.sha256(raw).hexdigest() != direct.native.sha256 or len(raw) != direct.native.bytes:
        raise _refused("native_modified", "the plan's native bytes no longer match native.sha256")
    return raw


#: the one key a recorded extension (``run --resume --extend N``) changes
EXTENDED_KEY = "trainer.total_training_steps"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return bool(a == b)


def _verl_default(key: str, value: Any, native: dict[str, Any], estimator: Estimator | None) -> bool:
    """Whether ``value`` is what verl 0.9.1 uses for ``key`` when the native file leaves it out."""
    if key == "critic.enable":
        return estimator is not None and value is (estimator == "ppo")
    if key in INTERPOLATED:
        return INTERPOLATED[key] in native and _same(native[INTERPOLATED[key]], value)
    rule = rules_by_key().get(key)
    return rule is not None and rule.verl_default is not None and _same(rule.verl_default, value)


def _derived(key: str, value: Any, native: dict[str, Any]) -> bool:
    """Whether ``value`` is the value of the native key a ``same`` rule ties ``key`` to (the one seed)."""
    rule = rules_by_key().get(key)
    return rule is not None and rule.action == "same" and rule.field in native and _same(native[rule.field], value)


def _engine_choice(rule: ImportRule, native: Any, bundle: Any) -> bool:
    """Both values are ones an ``expect`` rule accepts as the same math (verl's FSDP1 and FSDP2)."""
    accepted = (rule.value, *rule.also)
    return rule.action == "expect" and bool(rule.also) and native in accepted and bundle in accepted


def _status(key: str, native: dict[str, Any], bundle: dict[str, Any], added_cycles: int, algo: Estimator | None) -> str:
    in_n, in_b = key in native, key in bundle
    rule = rules_by_key().get(key)
    if in_n and in_b and _same(native[key], bundle[key]):
        return "same"
    if key in KL_NAME_KEYS and in_n and in_b and KL_ALIASES.get(str(native[key])) == bundle[key]:
        return "same"  # verl's other name of the same formula (kl = k1, mse = k2, k3 = low_var_kl)
    if key == EXTENDED_KEY and added_cycles and in_n and in_b and _same(native[key] + added_cycles, bundle[key]):
        return "extended"
    if key in RUNTIME_KEYS or (in_n and in_b and rule is not None and _engine_choice(rule, native[key], bundle[key])):
        return "runtime"
    if key in IGNORED_KEYS or (rule is not None and rule.only is not None and algo is not None and rule.only != algo):
        return "ignored"
    if any(
        key in keys and native.get(switch) is not True and bundle.get(switch) is not True
        for switch, keys in KL_GATED.items()
    ):
        return "ignored"  # a KL setting while its switch is off: verl never reads it
    if (
        in_n
        and not in_b
        and rule is not None
        and rule.verl_default is not None
        and _same(native[key], rule.verl_default)
    ):
        return "default"  # the bundle leaves the key to verl, whose default is the native value
    if in_b and not in_n and _verl_default(key, bundle[key], native, algo):
        return "default"
    if in_b and not in_n and _derived(key, bundle[key], native):
        return "derived"
    if not in_n:
        return "bundle_only"
    return "native_only" if not in_b else "changed"


def native_diff(native_yaml: bytes, bundle_config: dict[str, Any], *, added_cycles: int = 0) -> dict[str, Any]:
    """Key by key: native value vs the bundle's value. ``runtime`` keys are the documented bindings and the
    engine choices an ``expect`` rule accepts either way (FSDP1 in the native file, FSDP2 in the bundle).

    ``added_cycles``: the cycles the run's recorded extensions added (``run --resume --extend N``,
    the plan's ``lineage``). ``trainer.total_training_steps`` is then ``extended`` when it is exactly the
    native value plus those cycles, and ``changed`` otherwise. A key the native file leaves out is
    ``default`` when the bundle states what verl 0.9.1 would use anyway (its default, or the actor's key a
    critic key interpolates) and ``derived`` when it states the value of the key a ``same`` rule ties it
    to (the one seed); a key the bundle leaves out whose native value is verl's default is ``default`` too. A key
    of the other estimator (a critic key in a GRPO file) and a KL setting whose switch is off are ``ignored``.
    """
    native = flatten(loads_yaml(native_yaml.decode("utf-8")))  # read by read_native first: already checked
    bundle = flatten(bundle_config)
    algo = ESTIMATORS.get(str(native.get("algorithm.adv_estimator")))
    entries = []
    for key in sorted(set(native) | set(bundle)):
        status = _status(key, native, bundle, added_cycles, algo)
        entries.append({"key": key, "status": status, "native": native.get(key), "bundle": bundle.get(key)})
    counts = {s: sum(e["status"] == s for e in entries) for s in STATUSES}
    return {
        "compiler": COMPILER_V4,
        "native_sha256": hashlib.sha256(native_yaml).hexdigest(),
        "runtime_keys": sorted(RUNTIME_KEYS),
        "ignored_keys": sorted(IGNORED_KEYS),
        "added_cycles": added_cycles,
        "counts": counts,
        "semantically_equal": counts["changed"] == counts["native_only"] == counts["bundle_only"] == 0,
        "entries": entries,
    }
