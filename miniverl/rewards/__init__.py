"""Rewards and verifiers: ``fn(prompt, response, **meta) -> float``, a registry, plug-ins, weighted sums."""

from miniverl.rewards import calculator, formatting, sql
from miniverl.rewards.base import (
    CompositeReward,
    RewardScore,
    get_reward,
    list_rewards,
    load_reward,
    resolve_reward,
    reward_meta,
)
from miniverl.rewards.calculator import calculator_exact, extract_final_integer, generate_calculator_problems
from miniverl.rewards.formatting import generate_formatting_prompts, target_length
from miniverl.rewards.registry import RewardFn, register_reward
from miniverl.rewards.sql import sql_result_match

__all__ = [
    "CompositeReward",
    "RewardFn",
    "RewardScore",
    "calculator",
    "calculator_exact",
    "extract_final_integer",
    "formatting",
    "generate_calculator_problems",
    "generate_formatting_prompts",
    "get_reward",
    "list_rewards",
    "load_reward",
    "register_reward",
    "resolve_reward",
    "reward_meta",
    "sql",
    "sql_result_match",
    "target_length",
]
