"""GAE re-derived from the evidence: each PPO update's trajectory records keep the ``[N, T]`` rows the product gave
its GAE (per-token rewards, the critic's values, the response mask) and what it computed (advantages, returns,
whitened advantages). The judge recomputes all of it in pure Python with gamma and lambda from the plan, and
compares with the product's numbers within :data:`TOLERANCE`.

The formulas are the product's documented ones (``miniverl.algorithms.gae_advantages`` and ``masked_whiten``,
verl 0.9's ``compute_gae_advantage_return``), written here again so that no product code judges itself:

- over a row's selected positions :math:`t_1 < \\dots < t_m`: :math:`\\delta_i = r_{t_i} + \\gamma V_{t_{i+1}} -
  V_{t_i}` (:math:`V_{t_{m+1}} = 0`), :math:`A_{t_i} = \\delta_i + \\gamma\\lambda A_{t_{i+1}}`,
  :math:`R_{t_i} = A_{t_i} + V_{t_i}`; masked-out positions hold 0;
- whitening over every selected token of the update: :math:`(A - \\mu) / \\sqrt{\\sigma^2 + 10^{-8}}` with the
  unbiased variance :math:`\\sigma^2`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.qualify.full.reading import finite, read_jsonl

TOLERANCE = 1e-6
WHITEN_EPS = 1e-8  # the product's masked_whiten epsilon (verl's)
# The per-trajectory advantage a record states is the mean of its whitened tokens, which the product takes in
# float32 (the dtype its losses use): it agrees with the float64 mean to float32's precision, not to TOLERANCE.
TRAJECTORY_MEAN_TOLERANCE = 1e-5


class GaeRows:
    """One update's ``[N, T]`` rows as the records keep them (every row the same width, floats finite)."""

    def __init__(self, mask: list[list[int]], rewards: list[list[float]], values: list[list[float]]) -> None:
        self.mask, self.rewards, self.values = mask, rewards, values


def gae(rows: GaeRows, gamma: float, lam: float) -> tuple[list[list[float]], list[list[float]]]:
    """Advantages and returns, unwhitened, per row (masked-out positions 0)."""
    advantages: list[list[float]] = []
    returns: list[list[float]] = []
    for mask, rewards, values in zip(rows.mask, rows.rewards, rows.values, strict=True):
        adv = [0.0] * len(mask)
        next_value = last = 0.0
        for t in reversed(range(len(mask))):
            if not mask[t]:
                continue
            last = rewards[t] + gamma * next_value - values[t] + gamma * lam * last
            next_value = values[t]
            adv[t] = last
        advantages.append(adv)
        returns.append([a + v if m else 0.0 for a, v, m in zip(adv, values, mask, strict=True)])
    return advantages, returns


def whiten(values: list[list[float]], mask: list[list[int]]) -> list[list[float]]:
    """Whitened over every selected token of the update (masked-out positions 0)."""
    chosen = [v for row, m in zip(values, mask, strict=True) for v, keep in zip(row, m, strict=True) if keep]
    mean = sum(chosen) / max(len(chosen), 1)
    var = sum((v - mean) ** 2 for v in chosen) / max(len(chosen) - 1, 1)
    scale = 1.0 / math.sqrt(var + WHITEN_EPS)
    return [
        [(v - mean) * scale if keep else 0.0 for v, keep in zip(row, m, strict=True)]
        for row, m in zip(values, mask, strict=True)
    ]


def _floats(value: Any, width: int) -> list[float] | None:
    if not isinstance(value, list) or len(value) != width:
        return None
    out = [finite(x) for x in value]
    return None if any(x is None for x in out) else [x for x in out if x is not None]


def _selected_mean(row: list[float], mask: list[int]) -> float:
    return sum(a for a, keep in zip(row, mask, strict=True) if keep) / max(sum(mask), 1)


def _worst(a: list[list[float]], b: list[list[float]]) -> float:
    return max((abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)), default=0.0)


def judge_update(path: Path | None, step: int, plan: dict[str, Any] | None) -> tuple[bool, str]:
    """One update's trajectories file: the GAE rows are there and bound to their trajectories (the mask selects
    exactly the response tokens, the score sits on the last one, the records are of this update's policy
    version), the recomputed advantages, returns and whitened advantages equal the product's within TOLERANCE,
    each record's advantage is its whitened tokens' mean, and the numbers are not trivial."""
    ppo = _ppo_settings(plan)
    if ppo is None:
        return False, "plan.json missing or without algorithm.ppo gamma, lam, whiten_advantages and kl_coef"
    gamma, lam, whitened_by_plan, kl_coef = ppo
    if kl_coef != 0:
        return False, f"kl_coef {kl_coef}: KL-in-reward token rewards cannot be re-derived without the models"
    lines = read_jsonl(path)
    if not lines:
        return False, "trajectories file missing, unreadable or empty"
    rows_kept = [line.get("gae") for line in lines]
    widths = {len(g["mask"]) for g in rows_kept if isinstance(g, dict) and isinstance(g.get("mask"), list)}
    if len(widths) != 1:
        return False, "not every record keeps a GAE row of one width (no gae, or rows of different widths)"
    width = widths.pop()
    rows = GaeRows([], [], [])
    claimed: dict[str, list[list[float]]] = {"advantages": [], "returns": [], "whitened_advantages": []}
    traj_adv: list[float] = []
    for number, line in enumerate(lines, start=1):
        bad = _bind(line, step, width, kl_coef)
        if bad:
            return False, f"record {number}: {bad}"
        g = line["gae"]
        rows.mask.append(list(g["mask"]))
        rows.rewards.append(_floats(g["rewards"], width) or [])
        rows.values.append(_floats(g["values"], width) or [])
        for key in claimed:
            got = _floats(g.get(key), width)
            if got is None and (key != "whitened_advantages" or whitened_by_plan):
                return False, f"record {number}: gae.{key} is not {width} finite numbers"
            claimed[key].append(got or [])
        traj_adv.append(finite(line.get("advantage")) or 0.0)
    advantages, returns = gae(rows, gamma, lam)
    errors = {"advantages": _worst(advantages, claimed["advantages"]), "returns": _worst(returns, claimed["returns"])}
    trained_on = advantages
    if whitened_by_plan:
        trained_on = whiten(advantages, rows.mask)
        errors["whitened_advantages"] = _worst(trained_on, claimed["whitened_advantages"])
    elif any(g for g in claimed["whitened_advantages"]):
        return False, "the product whitened advantages the plan says not to whiten"
    means = [_selected_mean(row, mask) for row, mask in zip(trained_on, rows.mask, strict=True)]
    errors["record advantage"] = max(abs(a - b) for a, b in zip(means, traj_adv, strict=True))
    chosen = [
        (a, r, v)
        for adv_row, ret_row, val_row, mask in zip(advantages, returns, rows.values, rows.mask, strict=True)
        for a, r, v, keep in zip(adv_row, ret_row, val_row, mask, strict=True)
        if keep
    ]
    trivial = [
        what
        for what, bad in (
            ("advantages all equal", len({a for a, _, _ in chosen}) < 2),
            ("returns all zero", all(r == 0 for _, r, _ in chosen)),
            ("critic values constant", len({v for _, _, v in chosen}) < 2),
        )
        if bad
    ]
    limits = {key: TRAJECTORY_MEAN_TOLERANCE if key == "record advantage" else TOLERANCE for key in errors}
    off = [f"{key} off by {err:.3g}" for key, err in errors.items() if not err <= limits[key]]
    why = (
        f"{len(lines)} records x {width} positions, {len(chosen)} response tokens; recomputed with gamma {gamma}, "
        f"lambda {lam}{', whitened' if whitened_by_plan else ''}: "
        + ("; ".join(off) if off else f"max error {max(errors.values()):.2g}")
        + (f"; trivial: {', '.join(trivial)}" if trivial else "")
    )
    return not off and not trivial, why


def _bind(line: dict[str, Any], step: int, width: int, kl_coef: float) -> str | None:
    """Why this record's GAE row is not its own trajectory's, of this update (None when it is)."""
    g, tokens = line.get("gae"), line.get("response_token_ids")
    if not isinstance(g, dict) or not isinstance(tokens, list) or not 1 <= len(tokens) <= width:
        return "no gae row or no response tokens"
    if line.get("policy_version") != step - 1:
        return f"policy_version {line.get('policy_version')!r}, not update {step}'s {step - 1}"
    n = len(tokens)
    if g.get("mask") != [1] * n + [0] * (width - n):
        return f"the mask does not select exactly its {n} response tokens"
    rewards, values = _floats(g.get("rewards"), width), _floats(g.get("values"), width)
    reward = finite(line.get("reward"))
    if rewards is None or values is None or reward is None:
        return "rewards, values or the record's reward are not finite numbers of the row's width"
    if kl_coef == 0 and (rewards[n - 1] != reward or any(rewards[: n - 1]) or any(rewards[n:])):
        return f"the token rewards are not its score {reward} on its last response token alone"
    return None


def _ppo_settings(plan: dict[str, Any] | None) -> tuple[float, float, bool, float] | None:
    config = plan.get("config") if plan is not None else None
    algorithm = config.get("algorithm") if isinstance(config, dict) else None
    ppo = algorithm.get("ppo") if isinstance(algorithm, dict) else None
    if not isinstance(ppo, dict):
        return None
    gamma, lam, kl = finite(ppo.get("gamma")), finite(ppo.get("lam")), finite(ppo.get("kl_coef"))
    white = ppo.get("whiten_advantages")
    if gamma is None or lam is None or kl is None or not isinstance(white, bool):
        return None
    return gamma, lam, white, kl
