"""``miniverl diagnose BUNDLE``: would verl 0.9 launch this bundle? Checked locally, without Ray or a GPU.

1. the manifest's file hashes match (``bundle_modified``);
2. verl is importable (otherwise exit 2) and is the manifest's version (``verl_version_mismatch``);
3. the bundle's YAML composes with verl's own Hydra defaults (``compose_failed``);
4. verl's own ``validate_config`` passes on the composed config (``verl_validation_failed``);
5. the reward file imports and has verl's signature, and its terms resolve (``reward_import_failed``);
6. the Parquet file has verl's columns (``dataset_columns``);
7. a run's start adapter agrees with the YAML's LoRA (``adapter_mismatch``); PPO: the critic adapter is
   a ``TOKEN_CLS`` adapter with the value head (``score``) that agrees with the YAML's critic LoRA
   (``critic_adapter_mismatch``);
8. ``bash launch.sh --cfg job`` composes through verl's own ``main_ppo`` Hydra entry
   (``launch_script_failed``);
9. a bundled base model directory is present (``model_missing``); with it, verl's RLHFDataset
   loads the Parquet and ``compute_score`` is called once (``verl_dataset_failed``).

``launch_status`` is ``ready`` or the first blocker's code. ``quantization`` is the manifest's: an NF4
run is launched on the same base in full precision (not a blocker: the rules compile it, with a note).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import inspect
import io
from pathlib import Path
from typing import Any

from miniverl.errors import UsageError
from miniverl.handoff.ir import COMPILER_V2
from miniverl.handoff.manifest import read_manifest, verify_files

VERL_COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")
REWARD_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")


def diagnose(bundle: Path) -> dict[str, Any]:
    manifest = read_manifest(bundle)
    if importlib.util.find_spec("verl") is None:
        raise UsageError(
            f"verl is not installed in this environment; diagnose needs verl {manifest.verl_version} in a venv "
            f"of its own (it pins transformers<5.11): {verl_env_hint(manifest.verl_version)}"
        )
    root = bundle.resolve()
    checks: dict[str, Any] = {}
    blockers: list[dict[str, str]] = []

    def block(code: str, detail: str) -> None:
        blockers.append({"code": code, "detail": detail})

    problems = verify_files(root, manifest)
    checks["files"] = {"verified": len(manifest.files), "problems": problems}
    if problems:
        block("bundle_modified", "; ".join(problems[:5]))
    verl_version = importlib.metadata.version("verl")
    checks["verl_version"] = verl_version
    if verl_version != manifest.verl_version:
        block("verl_version_mismatch", f"installed verl {verl_version}, bundle compiled for {manifest.verl_version}")

    from miniverl.handoff.standins import install_vllm_standins

    stand_ins = install_vllm_standins()
    checks["stand_ins"] = stand_ins
    config = None
    overrides = _launch_overrides(root, manifest)
    if manifest.compiler == COMPILER_V2 and manifest.model.binding != "bundle":
        # verl's validate_config instantiates the critic's HFModelConfig, which reads config.json
        local = _local_base(manifest)
        checks["base_model"] = "resolved locally (config.json for the critic)" if local else "not available here"
        if local is None:
            block(
                "model_unavailable",
                f"verl's critic config needs the base model's config.json; {manifest.model.model_id} is not in the "
                "local cache: set MINIVERL_MODEL_PATH to its directory (or `miniverl models fetch` it)",
            )
        else:
            overrides += [f"{key}={local}" for key in ("actor_rollout_ref.model.path", "critic.model.path")]
    try:
        config = _compose(root, manifest.config_name, overrides)
        checks["compose"] = "ok"
    except Exception as exc:
        block("compose_failed", _one_line(exc))

    def run(code: str, key: str, check: Any, *args: Any) -> None:
        try:
            checks[key] = check(*args)
        except Exception as exc:
            block(code, _one_line(exc))

    if config is not None:
        run("verl_validation_failed", "validate_config", _validate, config)
        run(
            "overlay_not_applied", "overlay", _overlay_applied, root / "config" / f"{manifest.config_name}.yaml", config
        )
        run("launch_script_failed", "launch_script", _dry_launch, root, config)
    run("reward_import_failed", "reward", _check_reward, root / "reward_fn.py")
    run("dataset_columns", "dataset", _check_dataset, root / "data" / "train.parquet")
    if manifest.adapter is not None:
        run("adapter_mismatch", "adapter", _check_adapter, root / "adapter", config)
    if manifest.compiler == COMPILER_V2:
        run("critic_adapter_mismatch", "critic_adapter", _check_critic_adapter, root / "critic_adapter", config)
    model_dir = root / "model"
    if manifest.model.binding != "bundle":
        checks["verl_dataset"] = "skipped: the tokenizer is resolved at launch (hub or builtin model)"
    elif not (model_dir / "config.json").is_file():
        block("model_missing", "model/config.json is absent")
    elif blockers:
        checks["verl_dataset"] = "skipped: earlier blockers"
    else:
        run("verl_dataset_failed", "verl_dataset", _load_with_verl, root, model_dir, config)
    checks["model"] = {
        "binding": manifest.model.binding,
        "resolved": "in the bundle" if manifest.model.binding == "bundle" else "by launch.sh at launch time",
        "dtype": manifest.model.dtype,
    }
    status = "ready" if not blockers else blockers[0]["code"]
    return {
        "checked": f"config valid for verl {verl_version}"
        if not blockers
        else f"config refused by verl {verl_version}",
        "launch_missing": launch_missing(),
        "bundle": bundle.name,
        "launch_status": status,
        "blockers": blockers,
        "compiler": manifest.compiler,
        "ir_digest": manifest.ir_digest,
        "rules_digest": manifest.rules_digest,
        "verl_version": verl_version,
        "quantization": manifest.quantization.model_dump(mode="json"),
        "checks": checks,
        "ray_started": False,
    }


def _launch_overrides(root: Path, manifest: Any) -> list[str]:
    """The same locations launch.sh passes (absolute only in this process, never written)."""
    overrides = [
        f"data.train_files={root / 'data' / 'train.parquet'}",
        f"data.val_files={root / 'data' / 'train.parquet'}",
        f"reward.custom_reward_function.path={root / 'reward_fn.py'}",
        f"trainer.default_local_dir={root / 'checkpoints'}",
    ]
    if manifest.model.binding == "bundle":
        overrides.append(f"actor_rollout_ref.model.path={root / 'model'}")
        if manifest.compiler == COMPILER_V2:  # the critic starts from the same base
            overrides.append(f"critic.model.path={root / 'model'}")
    if manifest.compiler == COMPILER_V2:
        overrides.append(f"critic.model.lora_adapter_path={root / 'critic_adapter'}")
    if manifest.adapter is not None:
        overrides.append(f"actor_rollout_ref.model.lora_adapter_path={root / 'adapter'}")
    return overrides


def _local_base(manifest: Any) -> str | None:
    """The base model's local directory without downloading: MINIVERL_MODEL_PATH, the builtin cache, the
    Hugging Face cache at the pinned revision; None when none holds it (this process only, never written)."""
    import os

    from miniverl.handoff.launch import MODEL_ENV

    given = os.environ.get(MODEL_ENV)
    if given:
        return given
    model = manifest.model
    if model.binding == "builtin":
        from miniverl.models.builtin import cached_builtin

        found = cached_builtin(str(model.model_id))
        return str(found) if found is not None else None
    if model.binding == "hub":
        try:
            from huggingface_hub import snapshot_download

            folder = snapshot_download(
                str(model.model_id), revision=model.revision, local_files_only=True, allow_patterns=["config.json"]
            )
        except Exception:
            return None
        return str(folder)
    return None


def _compose(root: Path, config_name: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(root / "config"), version_base=None):
        return compose(config_name=config_name, overrides=overrides)


def _validate(config: Any) -> dict[str, Any]:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    use_ref = bool(need_reference_policy(config))
    use_critic = bool(need_critic(config))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        validate_config(config=config, use_reference_policy=use_ref, use_critic=use_critic)
    return {
        "passed": True,
        "use_reference_policy": use_ref,
        "use_critic": use_critic,
        "adv_estimator": str(config.algorithm.adv_estimator),
        "rollout": str(config.actor_rollout_ref.rollout.name),
        "verl_said": [line for line in printed.getvalue().splitlines() if line.strip()][-3:],
    }


def _overlay_applied(yaml_path: Path, composed: Any) -> dict[str, Any]:
    mismatched = _overlay_mismatches(yaml_path, composed)
    if mismatched:
        raise ValueError(f"composed values differ from the bundle's YAML at {', '.join(mismatched[:5])}")
    return {"applied": True}


def _overlay_mismatches(yaml_path: Path, composed: Any) -> list[str]:
    """Keys of the bundle's YAML whose composed value differs (verl defaults must not win)."""
    from miniverl import bounded

    overlay = bounded.read_yaml(yaml_path, limit=bounded.CONFIG_MAX_BYTES, what="a bundle's verl YAML")
    from omegaconf import OmegaConf  # verl's environment has it; the read above needs nothing of it

    resolved = OmegaConf.to_container(composed, resolve=False)
    located = {"data.train_files", "data.val_files", "reward.custom_reward_function.path", "trainer.default_local_dir"}
    located |= {"actor_rollout_ref.model.path", "actor_rollout_ref.model.lora_adapter_path"}
    located |= {"critic.model.path", "critic.model.lora_adapter_path"}
    out: list[str] = []

    def walk(node: Any, have: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                child = have.get(key) if isinstance(have, dict) else None
                walk(value, child, f"{prefix}.{key}" if prefix else str(key))
        elif prefix not in located and node != have:
            out.append(prefix)

    walk({k: v for k, v in overlay.items() if k not in ("hydra", "defaults")}, resolved, "")
    return out


def _dry_launch(root: Path, config: Any) -> dict[str, Any]:
    """``bash launch.sh --cfg job``: verl's own ``hydra.main`` entry composes and prints the config, runs nothing.

    The base model is not resolved (``MINIVERL_MODEL_PATH`` is set to what the YAML names), so no
    download happens; everything else is the exact command line a launch uses.
    """
    import os
    import subprocess
    import sys

    import yaml

    model = config.actor_rollout_ref.model.path
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "MINIVERL_MODEL_PATH": str(model),
        "HYDRA_FULL_ERROR": "0",
    }
    done = subprocess.run(
        ["bash", str(root / "launch.sh"), "--cfg", "job"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-1:] or ["no output"]
        raise RuntimeError(f"launch.sh --cfg job exited {done.returncode}: {tail[0]}")
    printed = yaml.safe_load(done.stdout)
    expected = {
        "algorithm.adv_estimator": str(config.algorithm.adv_estimator),
        "data.train_files": str(root / "data" / "train.parquet"),
        "actor_rollout_ref.model.lora_rank": int(config.actor_rollout_ref.model.lora_rank),
    }
    if bool(config.critic.get("enable")):  # PPO: the critic starts from the bundle's critic adapter
        expected["critic.model.lora_adapter_path"] = str(root / "critic_adapter")
    for dotted, want in expected.items():
        node = printed
        for part in dotted.split("."):
            node = node[part]
        if node != want:
            raise RuntimeError(f"launch.sh composes {dotted}={node!r}, expected {want!r}")
    return {"entry": "python -m verl.trainer.main_ppo", "composed": True, "checked": sorted(expected)}


def _adapter_config(adapter_dir: Path) -> Any:
    """A bundle's ``adapter_config.json``, read bounded (a FIFO or /dev/zero there blocks nothing)."""
    from miniverl import bounded

    found = bounded.read_json(
        adapter_dir / "adapter_config.json", limit=bounded.MODEL_CONFIG_MAX_BYTES, what="an adapter config"
    )
    if not isinstance(found, dict):
        raise ValueError(f"{adapter_dir / 'adapter_config.json'} is not a JSON object")
    return found


def _check_adapter(adapter_dir: Path, config: Any) -> dict[str, Any]:
    """verl loads the start adapter with its own adapter_config.json: it must agree with the YAML's LoRA."""
    found = _adapter_config(adapter_dir)
    if config is None:
        raise ValueError("the config did not compose; the adapter cannot be compared")
    model = config.actor_rollout_ref.model
    want = {
        "r": int(model.lora_rank),
        "lora_alpha": int(model.lora_alpha),
        "target_modules": sorted(model.target_modules),
    }
    have = {
        "r": found.get("r"),
        "lora_alpha": found.get("lora_alpha"),
        "target_modules": sorted(found.get("target_modules") or []),
    }
    if have != want:
        raise ValueError(f"adapter_config.json {have} differs from actor_rollout_ref.model {want}")
    return {
        "r": have["r"],
        "lora_alpha": have["lora_alpha"],
        "base_model_name_or_path": found.get("base_model_name_or_path"),
    }


def _check_critic_adapter(adapter_dir: Path, config: Any) -> dict[str, Any]:
    """verl loads the critic with this adapter's own config: TOKEN_CLS (the value head trained as
    ``modules_to_save``), and the same LoRA as the YAML's ``critic.model``."""
    from safetensors import safe_open

    from miniverl import bounded
    from miniverl.handoff.critic_adapter import HEAD, SCORE_KEYS

    found = _adapter_config(adapter_dir)
    if config is None:
        raise ValueError("the config did not compose; the critic adapter cannot be compared")
    if found.get("task_type") != "TOKEN_CLS" or HEAD not in (found.get("modules_to_save") or []):
        raise ValueError(
            f"critic adapter task_type {found.get('task_type')!r}, modules_to_save {found.get('modules_to_save')}: "
            "verl would not train the value head"
        )
    model = config.critic.model
    want: dict[str, Any] = {"r": int(model.lora_rank), "lora_alpha": int(model.lora_alpha)}
    want["target_modules"] = sorted(model.target_modules)
    have = {"r": found.get("r"), "lora_alpha": found.get("lora_alpha")}
    have["target_modules"] = sorted(found.get("target_modules") or [])
    if have != want:
        raise ValueError(f"critic adapter_config.json {have} differs from critic.model {want}")
    weights = adapter_dir / "adapter_model.safetensors"
    bounded.check_regular(weights, limit=bounded.WEIGHTS_MAX_BYTES, what="an adapter's weights")
    with safe_open(str(weights), framework="pt") as handle:
        keys = set(handle.keys())
        if not set(SCORE_KEYS) <= keys:
            raise ValueError(f"critic adapter lacks the value head tensors {list(SCORE_KEYS)}")
        shape = list(handle.get_slice(SCORE_KEYS[0]).get_shape())
    if shape[0] != 1:
        raise ValueError(f"value head weight {shape}: verl's critic has one label")
    return {"task_type": "TOKEN_CLS", "value_head": HEAD, "hidden_size": shape[1], "lora_tensors": len(keys) - 2}


def _load_with_verl(root: Path, model_dir: Path, config: Any) -> dict[str, Any]:
    """verl's own RLHFDataset over the bundle's Parquet with the bundled tokenizer (CPU only)."""
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        dataset = RLHFDataset(
            data_files=[str(root / "data" / "train.parquet")], tokenizer=tokenizer, config=config.data
        )
        first = dataset[0]
    reward = _reward_probe(root, model_dir, first)
    return {"rows": len(dataset), "first_keys": sorted(first), "reward_probe": reward}


def _reward_probe(root: Path, model_dir: Path, row: dict[str, Any]) -> float:
    """Call the bundle's compute_score once the way verl's naive reward manager does."""
    import os

    from miniverl.handoff.reward_bridge import TOKENIZER_ENV

    spec = importlib.util.spec_from_file_location("miniverl_bundle_reward_probe", root / "reward_fn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ground_truth = row["reward_model"]["ground_truth"]
    previous = os.environ.get(TOKENIZER_ENV)
    os.environ[TOKENIZER_ENV] = str(model_dir)
    try:
        value = module.compute_score(
            row["data_source"], f"The answer is {ground_truth}.", ground_truth, row["extra_info"]
        )
    finally:
        if previous is None:
            os.environ.pop(TOKENIZER_ENV, None)
        else:
            os.environ[TOKENIZER_ENV] = previous
    return float(value)


def _check_reward(path: Path) -> dict[str, Any]:
    from miniverl import bounded

    bounded.check_regular(path, limit=bounded.CONFIG_MAX_BYTES, what="a bundle's reward function")
    spec = importlib.util.spec_from_file_location("miniverl_bundle_reward_fn", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, "compute_score", None)
    if not callable(fn):
        raise ImportError(f"{path.name} has no compute_score")
    names = tuple(inspect.signature(fn).parameters)
    if names[: len(REWARD_PARAMETERS)] != REWARD_PARAMETERS:
        raise TypeError(f"compute_score{names} is not verl's (data_source, solution_str, ground_truth, extra_info)")
    from miniverl.handoff.reward_bridge import build_reward

    terms: list[str] = build_reward(module.TERMS).names if module.TERMS else []
    reward_model = getattr(module, "REWARD_MODEL", None)
    if reward_model is not None:
        terms.append("reward_model")
    return {
        "function": "compute_score",
        "terms": terms,
        "reward_model": None if reward_model is None else reward_model["spec"]["source"],
    }


def _check_dataset(path: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from miniverl import bounded

    bounded.check_regular(path, limit=bounded.PARQUET_MAX_BYTES, what="a bundle's dataset")
    schema = pq.read_schema(path)
    if tuple(schema.names) != VERL_COLUMNS:
        raise ValueError(f"columns {schema.names}, expected {list(VERL_COLUMNS)}")
    reward_model = schema.field("reward_model").type
    if "ground_truth" not in [reward_model.field(i).name for i in range(reward_model.num_fields)]:
        raise ValueError("reward_model has no ground_truth")
    return {"rows": pq.read_metadata(path).num_rows, "columns": list(schema.names)}


def in_checkout() -> bool:
    """Whether this miniverl runs from a source checkout (its noxfile beside the package), not an installed wheel."""
    return (Path(__file__).resolve().parents[2] / "noxfile.py").is_file()


def verl_env_hint(version: str) -> str:
    """Where to get a verl environment: the checkout's nox session, else the commands that make one."""
    if in_checkout():
        return "in this checkout, `nox -s verl_env` builds one from known-good/verl-0.9.1-cpu.txt"
    return (
        f"`python3 -m venv verl-env && verl-env/bin/pip install 'verl=={version}'`, then install this miniverl's "
        "release wheel into it (`verl-env/bin/pip install --no-deps ./miniverl-*.whl`) and run "
        "`verl-env/bin/python -m miniverl diagnose BUNDLE`"
    )


def launch_missing() -> list[str]:
    """What launching the bundle (``launch.sh``: Ray, vLLM rollouts, a CUDA GPU) needs and this machine lacks.

    Apart from the checks above, which validate the config with verl's own code and need none of them."""
    missing = []
    try:
        import torch

        if not torch.cuda.is_available():
            missing.append("a CUDA GPU (torch.cuda.is_available() is false)")
    except ImportError:
        missing.append("torch")
    for module, name in (("vllm", "vLLM (verl's rollout engine)"), ("ray", "Ray")):
        if importlib.util.find_spec(module) is None:
            missing.append(f"{name}: not installed")
    return missing


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]
