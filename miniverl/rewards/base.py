"""The reward-function interface, the registry of built-in rewards, user plug-ins and weighted sums.

A reward is any callable ``fn(prompt: str, response: str, **meta) -> float``. ``meta`` holds at
least ``answer``, ``prompt_id`` and ``response_token_count`` (see :func:`reward_meta`); a reward
takes the keys it needs as keyword parameters and absorbs the rest with ``**meta``. Rewards must
be deterministic: the same arguments always give the same float.

Built-ins register themselves with :func:`~miniverl.rewards.registry.register_reward` (this module imports
them all, so every lookup sees them); users plug their own in as
``"package.module:function"`` (:func:`load_reward`). :class:`CompositeReward` adds several of
them with weights and reports each component for the metrics.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from miniverl.errors import MiniverlError, UsageError
from miniverl.rewards import calculator, formatting, sql  # noqa: F401  (importing them registers the built-ins)
from miniverl.rewards.registry import REGISTERED, RewardFn

#: Keys the caller passes as ``meta``; a component's ``params`` may not shadow them.
META_KEYS = frozenset({"answer", "context", "task", "prompt_id", "sample_index", "group_id", "response_token_count"})


def list_rewards() -> list[str]:
    """Names of the registered rewards, sorted."""
    return sorted(REGISTERED)


def get_reward(name: str) -> RewardFn:
    """The registered reward ``name``; a :class:`UsageError` lists the known names otherwise."""
    try:
        return REGISTERED[name]
    except KeyError:
        known = ", ".join(sorted(REGISTERED))
        raise UsageError(
            f"unknown reward {name!r}; known rewards: {known} (or give a plug-in as 'package.module:function')"
        ) from None


def load_reward(spec: str) -> RewardFn:
    """Import a user reward given as ``"package.module:function"`` (dots allowed after the colon)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"reward plug-in {spec!r} must be written 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"cannot import reward module {module_name!r} ({exc}); make sure it is installed or on PYTHONPATH"
        ) from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"reward module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise UsageError(f"reward plug-in {spec!r} is a {type(target).__name__}, not a callable")
    fn: RewardFn = target
    return fn


def resolve_reward(name_or_spec: str) -> RewardFn:
    """A registered name (``"calculator_exact"``) or a plug-in spec (``"pkg.mod:fn"``)."""
    return load_reward(name_or_spec) if ":" in name_or_spec else get_reward(name_or_spec)


def check_reward_value(name: str, value: Any) -> float:
    """A reward's result as a float; a UsageError if it is not a finite real number."""
    if not isinstance(value, numbers.Real):
        raise UsageError(f"reward {name!r} returned a {type(value).__name__}; a reward must return a float")
    result = float(value)
    if not math.isfinite(result):
        raise UsageError(f"reward {name!r} returned {result}; a reward must return a finite float")
    return result


def reward_meta(row: Any, *, response_token_count: int, **extra: Any) -> dict[str, Any]:
    """The ``meta`` for one response to ``row`` (a PromptRow or anything with the same attributes).

    ``response_token_count`` is the number of generated tokens *excluding* a terminating EOS
    (``Trajectory.response_token_count``). ``extra`` (e.g. ``sample_index``, ``group_id``) is added.
    """
    meta = {
        "answer": row.answer,
        "context": row.context,
        "task": row.task,
        "prompt_id": row.prompt_id,
        "response_token_count": response_token_count,
    }
    meta.update(extra)
    return meta


@dataclass(frozen=True)
class RewardScore:
    """A composite reward: ``total = sum(weight * components[name])``."""

    total: float
    components: dict[str, float]


def _meta_filter(name: str, fn: RewardFn, params: Mapping[str, Any]) -> frozenset[str] | None:
    """Check ``params`` against ``fn``'s signature; return the meta keys ``fn`` can take.

    ``None`` means "all of them" (``fn`` has ``**meta``, or its signature cannot be read), so a
    plug-in written as ``def f(prompt, response)`` or ``def f(prompt, response, *, answer)``
    works: it gets only the meta keys it names.
    """
    shadowed = sorted(set(params) & META_KEYS)
    if shadowed:
        raise UsageError(f"reward {name!r}: params {shadowed} shadow per-sample fields; remove them")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # builtins / C callables: nothing to check against
    try:
        signature.bind_partial("prompt", "response")
    except TypeError:
        raise UsageError(f"reward {name!r} must accept (prompt, response, **meta)") from None
    parameters = list(signature.parameters.values())
    named = {
        p.name
        for p in parameters[2:]
        if p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    }
    unknown = sorted(set(params) - named)
    if unknown:
        accepted = ", ".join(sorted(named - META_KEYS)) or "none"
        raise UsageError(f"reward {name!r} has no parameter(s) {unknown}; its parameters: {accepted}")
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(named)


class CompositeReward:
    """A weighted sum of rewards: ``total = Σ_i weight_i · fn_i(prompt, response, **meta, **params_i)``.

    ``components`` is a list of ``(name, weight, params)``; ``name`` is a registered reward or a
    ``"pkg.mod:fn"`` plug-in, ``params`` are fixed keyword arguments (checked against the
    function's signature now, not at the first call). A function without ``**meta`` gets only the
    meta keys it names. Component names must be unique; they key the per-component scores reported
    for metrics. An exception inside a reward becomes a one-line :class:`UsageError`.
    """

    def __init__(self, components: Sequence[tuple[str, float, Mapping[str, Any] | None]]) -> None:
        if not components:
            raise UsageError("a composite reward needs at least one component")
        self._parts: list[tuple[str, float, RewardFn, dict[str, Any], frozenset[str] | None]] = []
        seen: set[str] = set()
        for name, weight, params in components:
            if name in seen:
                raise UsageError(f"reward {name!r} appears twice; list each reward once")
            seen.add(name)
            weight = float(weight)
            if not math.isfinite(weight):
                raise UsageError(f"reward {name!r} has weight {weight}; weights must be finite")
            fn = resolve_reward(name)
            params = dict(params or {})
            self._parts.append((name, weight, fn, params, _meta_filter(name, fn, params)))

    @property
    def names(self) -> list[str]:
        return [part[0] for part in self._parts]

    def score(self, prompt: str, response: str, **meta: Any) -> RewardScore:
        components: dict[str, float] = {}
        total = 0.0
        for name, weight, fn, params, accepted in self._parts:
            kwargs = meta if accepted is None else {k: v for k, v in meta.items() if k in accepted}
            try:
                raw = fn(prompt, response, **kwargs, **params)
            except MiniverlError:
                raise
            except Exception as exc:
                where = meta.get("prompt_id", "?")
                raise UsageError(f"reward {name!r} failed on prompt {where}: {type(exc).__name__}: {exc}") from exc
            value = check_reward_value(name, raw)
            components[name] = value
            total += weight * value
        return RewardScore(total=total, components=components)

    def __call__(self, prompt: str, response: str, **meta: Any) -> float:
        return self.score(prompt, response, **meta).total
