"""Checks that need no weights, run by ``plan`` (and again when ``run`` loads a plan).

The schema checks each field alone; these check what fields mean together and against the data:
rewards resolve and accept their params, a privileged-context teacher names a real column, its
template uses only known placeholders, and GRPO has groups that can give an advantage.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any

from miniverl.config.schema import REWARD_MODEL_TERM, MiniverlConfig, RewardTerm
from miniverl.data import COLUMNS, PromptRow
from miniverl.errors import ConfigError, DataError
from miniverl.rollout.backends import check_rollout_backend

TEMPLATE_FIELDS = ("prompt", "context")


def check_config(config: MiniverlConfig) -> None:
    """Raise a one-line :class:`ConfigError` for the first problem found."""
    _check_rewards(config)
    _check_grpo(config)
    check_rollout_backend(config)
    for role in ("teacher", "reference"):
        spec = getattr(config.models, role)
        if spec is not None and spec.privileged_context is not None:
            where = f"models.{role}.privileged_context"
            context = spec.privileged_context
            if context.column not in COLUMNS:
                raise ConfigError(
                    f"{where}.column {context.column!r} is not a dataset column; columns: {', '.join(COLUMNS)}"
                )
            check_template(context.template, where=f"{where}.template")


def check_data(config: MiniverlConfig, rows: Sequence[PromptRow]) -> None:
    """Data-dependent checks.

    - every reward scores every row's empty response (the model may answer with EOS at once), so
      a reward that cannot read a row's ``answer`` fails here rather than after the model loads;
    - a privileged-context column that is empty in every row is refused.
    """
    _score_empty_responses(config, rows)
    _check_prompt_tokens(config, rows)
    teacher = config.models.teacher
    if teacher is None or teacher.privileged_context is None:
        return
    column = teacher.privileged_context.column
    if not any(getattr(row, column).strip() for row in rows):
        raise DataError(
            f"{config.data.path}: column {column!r} is empty in every row, so the privileged-context "
            "teacher would see nothing extra; fill it or pick another models.teacher.privileged_context.column"
        )


def _token_counter(model_dir: Any) -> Callable[[str], int] | None:
    """Counts a text's tokens with the model's ``tokenizer.json`` (the ``tokenizers`` library, no torch), or None
    where neither is available (a builtin not fetched yet, a GGUF file)."""
    from pathlib import Path

    path = Path(model_dir) / "tokenizer.json" if model_dir is not None else None
    if path is None or not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    from miniverl import bounded

    bounded.check_regular(path, limit=bounded.PLAN_MAX_BYTES * 4, what="a tokenizer")
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _check_prompt_tokens(config: MiniverlConfig, rows: Sequence[PromptRow]) -> None:
    """Every prompt fits the student's context with room for ``rollout.max_new_tokens``, counted in tokens.

    A token covers at least one byte, so a prompt of at most that many bytes fits without being tokenized; only
    longer ones are counted, with the model's own tokenizer where the plan can read it.
    """
    from miniverl.models.sources import resolve

    resolved = resolve(config.models.student, fetch=False)
    context = (resolved.config or {}).get("max_position_embeddings")
    if not isinstance(context, int) or isinstance(context, bool):
        return
    room = context - config.rollout.max_new_tokens
    longer = [row for row in rows if len(row.prompt.encode("utf-8")) > room]
    count = _token_counter(resolved.path) if longer else None
    if count is None:
        return
    for row in longer:
        tokens = count(row.prompt)
        if tokens > room:
            raise DataError(
                f"{config.data.path}: prompt {row.prompt_id!r} is {tokens:,} tokens; the student's context of "
                f"{context:,} less rollout.max_new_tokens {config.rollout.max_new_tokens:,} leaves {room:,}: "
                "shorten the prompt or lower rollout.max_new_tokens"
            )


def check_template(template: str, *, where: str) -> None:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc} (write a literal brace as '{{{{' or '}}}}')") from None
    for _, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in TEMPLATE_FIELDS:
            allowed = ", ".join("{" + name + "}" for name in TEMPLATE_FIELDS)
            raise ConfigError(f"{where}: unknown placeholder {{{field}}}; allowed: {allowed}")
        if spec or conversion:
            raise ConfigError(f"{where}: placeholder {{{field}}} takes no format spec or conversion")


def _check_rewards(config: MiniverlConfig) -> None:
    from miniverl.errors import UsageError
    from miniverl.rewards import CompositeReward

    if not config.algorithm.rewards and config.algorithm.name in ("grpo", "ppo"):
        raise ConfigError(
            f"algorithm.rewards is empty; {config.algorithm.name.upper()} needs at least one reward "
            "(see `miniverl rewards list`)"
        )
    terms = _rule_terms(config)
    if not terms:
        return
    try:
        CompositeReward([(t.name, t.weight, t.params) for t in terms])
    except ConfigError:
        raise
    except UsageError as exc:
        raise ConfigError(f"algorithm.rewards: {exc}") from None


def _score_empty_responses(config: MiniverlConfig, rows: Sequence[PromptRow]) -> None:
    from miniverl.errors import UsageError
    from miniverl.rewards import CompositeReward, reward_meta

    terms = _rule_terms(config)
    if not terms:
        return
    reward = CompositeReward([(t.name, t.weight, t.params) for t in terms])
    for row in rows:
        try:
            reward.score(row.prompt, "", **reward_meta(row, response_token_count=0, sample_index=0))
        except UsageError as exc:
            raise DataError(f"{config.data.path}: {exc} (scoring an empty response at plan time)") from None


def _rule_terms(config: MiniverlConfig) -> list[RewardTerm]:
    """The rule rewards; the reward-model term is scored by ``models.reward`` (checked by the schema)."""
    return [t for t in config.algorithm.rewards if t.name != REWARD_MODEL_TERM]


def _check_grpo(config: MiniverlConfig) -> None:
    if config.algorithm.name == "grpo" and config.rollout.samples_per_prompt < 2:
        raise ConfigError(
            f"rollout.samples_per_prompt is {config.rollout.samples_per_prompt}; GRPO compares samples of the "
            "same prompt, so it needs at least 2 (a group of 1 always has zero advantage)"
        )
