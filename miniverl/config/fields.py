"""What every config section shares: the strict base model, the seed type, the pinning rule and the constants.

The sections themselves live in :mod:`miniverl.config.model_specs`, :mod:`miniverl.config.algorithm_sections`
and :mod:`miniverl.config.sections`; :mod:`miniverl.config.schema` assembles them into the config file format.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

IMMUTABLE_REVISION = re.compile(r"^[0-9a-f]{40}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
BUILTIN_MODELS = ("smollm2-135m-instruct",)
KlEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
KlMode = Literal["loss", "reward"]
REWARD_MODEL_TERM = "reward_model"
OFFLINE_ALGORITHMS = ("sft", "kd")
#: Upper bound on rollout.max_new_tokens whatever the model (the plan also checks it against the student's context).
MAX_NEW_TOKENS = 131_072


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


#: A seed fits torch's generator (a 64-bit seed): a larger one would fail only after the model loads.
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]


def require_immutable(revision: str | None, allow_mutable: bool, *, what: str) -> None:
    if revision is None:
        raise ValueError(f"{what} needs revision (a 40-hex commit)")
    if not IMMUTABLE_REVISION.match(revision) and not allow_mutable:
        raise ValueError(
            f"{what}: revision {revision!r} is mutable; pin a 40-hex commit or set allow_mutable_revision: true"
        )
