"""The SQL environment end to end: `init --example sql` plans, and GRPO on sqlite_recovery scores every sample."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from miniverl.data import load_prompts, sample_dataset
from miniverl.rewards.sql import sql_result_match
from tests.conftest import CliResult, tiny_config


def test_init_example_sql_plans_and_dry_runs(cli: Callable[..., CliResult], workdir: Path) -> None:
    result = cli("init", "proj", "--example", "sql", "--json")
    assert result.code == 0, result.err
    config = yaml.safe_load((workdir / "proj" / "config.yaml").read_text())
    assert config["algorithm"]["name"] == "grpo"
    assert [r["name"] for r in config["algorithm"]["rewards"]] == ["sql_result_match"]
    rows = load_prompts(workdir / "proj" / "prompts.parquet")
    assert {r.task for r in rows} == {"sqlite_recovery"} and len(rows) == result.json()["rows"] == 32
    os.chdir(workdir / "proj")
    planned = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert planned.code == 0, planned.err
    dry = cli("run", "--plan", "plan.json", "--run-id", "first", "--dry-run", "--json")
    assert dry.code == 0 and dry.json()["rows"] == 32


def test_grpo_on_sqlite_recovery_scores_every_sample_in_the_sandbox(
    cli: Callable[..., CliResult], write_config: Callable[..., Path], workdir: Path
) -> None:
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer, save_tiny_model_dir

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_llama(tokenizer, seed=0, max_position_embeddings=4096)  # SQL prompts are long
    model_dir = save_tiny_model_dir(workdir / "model", model, tokenizer)
    sample_dataset("sqlite_recovery", 4, 0, workdir / "prompts.parquet")
    rows = {r.prompt_id: r for r in load_prompts(workdir / "prompts.parquet")}
    config = tiny_config(model_dir, algorithm="grpo")
    config["algorithm"]["rewards"] = [{"name": "sql_result_match", "weight": 1.0, "params": {"valid_sql_credit": 0.1}}]
    config["rollout"].update({"samples_per_prompt": 2, "max_new_tokens": 8})
    config["train"]["cycles"] = 1
    write_config(config)
    planned = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert planned.code == 0, planned.err
    result = cli("run", "--plan", "plan.json", "--run-id", "sql", "--json")
    assert result.code == 0, result.err
    records = [
        json.loads(line)
        for line in (workdir / "runs" / "sql" / "trajectories" / "cycle-000001.jsonl").read_text().splitlines()
    ]
    assert len(records) == 4
    for record in records:
        row = rows[record["prompt_id"]]
        expected = sql_result_match(row.prompt, record["response_text"], answer=row.answer, valid_sql_credit=0.1)
        assert record["reward_components"] == {"sql_result_match": expected}
        assert record["reward"] == expected


def test_sft_trains_on_the_oracle_trajectories(
    cli: Callable[..., CliResult], write_config: Callable[..., Path], workdir: Path
) -> None:
    from miniverl.data import write_prompts
    from miniverl.data.sqlite_recovery import oracle_trajectories
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer, save_tiny_model_dir

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_llama(tokenizer, seed=0, max_position_embeddings=4096)
    model_dir = save_tiny_model_dir(workdir / "model", model, tokenizer)
    write_prompts(workdir / "prompts.parquet", [t.row for t in oracle_trajectories()])
    config = tiny_config(model_dir, algorithm="sft")
    config["algorithm"]["offline"] = {"target_column": "context"}
    config["algorithm"]["rewards"] = [{"name": "sql_result_match", "weight": 1.0}]
    config["rollout"]["samples_per_prompt"] = 1
    config["train"]["cycles"] = 2
    write_config(config)
    assert cli("plan", "config.yaml", "--out", "plan.json", "--json").code == 0
    result = cli("run", "--plan", "plan.json", "--run-id", "sft", "--json")
    assert result.code == 0, result.err
    lines = [json.loads(x) for x in (workdir / "runs" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(m["loss"] > 0 and m["adapter_delta_norm"] > 0 for m in lines)
