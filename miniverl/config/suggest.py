""" "Did you mean" for an unknown config key: a close name in the same section, the same name in another
section, or the key that a TRL or verl name corresponds to."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

#: Names from TRL's ``GRPOConfig`` / ``TrainingArguments`` and verl's ppo_trainer config (the last dotted part,
#: or a verl path), and the miniverl key that means the same thing (or the nearest one, with a note).
PEER_NAMES: dict[str, tuple[str, str]] = {
    # TRL
    "num_generations": ("rollout.samples_per_prompt", "TRL's num_generations"),
    "max_completion_length": ("rollout.max_new_tokens", "TRL's max_completion_length"),
    "beta": ("algorithm.grpo.kl_coef", "TRL's beta, the KL coefficient"),
    "epsilon": ("algorithm.grpo.clip_low", "TRL's epsilon (also algorithm.grpo.clip_high)"),
    "epsilon_high": ("algorithm.grpo.clip_high", "TRL's epsilon_high"),
    "num_iterations": ("algorithm.grpo.ppo_epochs", "TRL's num_iterations"),
    "num_train_epochs": ("train.cycles", "one cycle is one rollout and its update"),
    "max_steps": ("train.cycles", "one cycle is one rollout and its update"),
    "lr": ("train.learning_rate", "the learning rate"),
    "lora_r": ("models.student.lora.r", "the LoRA rank"),
    "lora_rank": ("models.student.lora.r", "verl's lora_rank"),
    "lora_alpha": ("models.student.lora.alpha", "the LoRA alpha"),
    "lora_dropout": ("models.student.lora.dropout", "the LoRA dropout"),
    "model_name_or_path": ("models.student.model_id", "with models.student.source: hub and a revision"),
    # verl
    "rollout.n": ("rollout.samples_per_prompt", "verl's actor_rollout_ref.rollout.n"),
    "n": ("rollout.samples_per_prompt", "verl's rollout.n"),
    "response_length": ("rollout.max_new_tokens", "verl's data.max_response_length"),
    "max_response_length": ("rollout.max_new_tokens", "verl's data.max_response_length"),
    "train_batch_size": ("rollout.prompts_per_cycle", "verl's data.train_batch_size, in prompts"),
    "kl_loss_coef": ("algorithm.grpo.kl_coef", "verl's kl_loss_coef (with algorithm.grpo.kl_mode: loss)"),
    "kl_loss_type": ("algorithm.grpo.kl_estimator", "verl's kl_loss_type"),
    "use_kl_loss": ("algorithm.grpo.kl_coef", "a kl_coef > 0 turns the KL term on"),
    "clip_ratio": ("algorithm.grpo.clip_low", "verl's clip_ratio (also algorithm.grpo.clip_high)"),
    "clip_ratio_low": ("algorithm.grpo.clip_low", "verl's clip_ratio_low"),
    "clip_ratio_high": ("algorithm.grpo.clip_high", "verl's clip_ratio_high"),
    "ppo_mini_batch_size": ("algorithm.grpo.mini_batches", "miniverl counts mini-batches per cycle, not prompts"),
    "total_training_steps": ("train.cycles", "verl's trainer.total_training_steps"),
    "adv_estimator": ("algorithm.name", "grpo or ppo"),
}


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from _models_in(typing.get_args(annotation)[0])
    elif origin is typing.Union or origin is types.UnionType:
        for arg in typing.get_args(annotation):
            yield from _models_in(arg)


def dotted_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key of ``model``'s config tree, dotted (sections and leaves)."""
    out = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        out.append(path)
        for sub in _models_in(field.annotation):
            out.extend(dotted_keys(sub, f"{path}."))
    return out


def suggestion(model: type[BaseModel], location: Sequence[Any]) -> str | None:
    """What an unknown key at ``location`` (pydantic's ``loc``) most likely meant, as a dotted key and why."""
    parts = [str(p) for p in location if not isinstance(p, int)]
    if not parts:
        return None
    name = parts[-1]
    section = ".".join(parts[:-1])
    keys = dotted_keys(model)
    known = set(keys)
    for alias in (".".join(parts[-2:]), name):
        peer = PEER_NAMES.get(alias)
        if peer is not None and peer[0] in known:
            return f"{peer[0]} ({peer[1]})"
    siblings = [k.rsplit(".", 1)[-1] for k in keys if k.rpartition(".")[0] == section]
    close = difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"{section}.{close[0]}" if section else close[0]
    elsewhere = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    if elsewhere:
        return " or ".join(elsewhere[:3])
    prefixes = [k for k in keys if k.rsplit(".", 1)[-1].startswith(name) and len(name) >= 2]
    if prefixes and section:
        near = [k for k in prefixes if k.startswith(f"{section}.")]
        if near:
            return " or ".join(near[:3])
    return None
