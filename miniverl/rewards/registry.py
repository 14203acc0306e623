"""The table of named rewards. :func:`register_reward` adds one; :mod:`miniverl.rewards.base` looks them up.

It imports no reward, so each built-in (calculator, formatting, sql) registers itself here while the lookup, which
imports every built-in, sits above them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from miniverl.errors import UsageError

RewardFn = Callable[..., float]
F = TypeVar("F", bound=Callable[..., float])

#: name -> reward function, filled by the :func:`register_reward` decorators as the reward modules are imported
REGISTERED: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[F], F]:
    """Decorator: make ``fn`` available as ``get_reward(name)``. A name is registered once."""

    def decorate(fn: F) -> F:
        if name in REGISTERED and REGISTERED[name] is not fn:
            raise UsageError(f"reward {name!r} is already registered; pick another name")
        REGISTERED[name] = fn
        return fn

    return decorate
