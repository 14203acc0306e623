"""The SQL environment end to end: `init --example sql` plans, GRPO on sqlite_recovery scores every sample,
and the 8 oracle trajectories feed SFT, offline KD and strict OPD (teacher-scored) on a tiny model."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _oracle_rows_and_model(workdir: Path) -> Path:
    """The 8 pinned oracle trajectories' rows as prompts.parquet, and a tiny model long enough for them."""
    from miniverl.data import write_prompts
    from miniverl.data.sqlite_recovery import oracle_trajectories
    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer, save_tiny_model_dir

    tokenizer = make_tiny_tokenizer()
    model = make_tiny_llama(tokenizer, seed=0, max_position_embeddings=4096)
    trajectories = oracle_trajectories()
    # the worked answer (the context column) carries the oracle response: SFT's and KD's target, OPD's privileged view
    assert len(trajectories) == 8 and all(t.response in t.row["context"] for t in trajectories)
    write_prompts(workdir / "prompts.parquet", [t.row for t in trajectories])
    return save_tiny_model_dir(workdir / "model", model, tokenizer)


def _trained_on_every_oracle_row(workdir: Path, run_id: str) -> list[dict[str, Any]]:
    """Metrics of a run whose one cycle covered the 8 oracle prompts and moved the student adapter."""
    from safetensors.torch import load_file

    from miniverl.data.sqlite_recovery import oracle_trajectories

    run_dir = workdir / "runs" / run_id
    records = [json.loads(x) for x in (run_dir / "trajectories" / "cycle-000001.jsonl").read_text().splitlines()]
    assert sorted({r["prompt_id"] for r in records}) == sorted(t.prompt_id for t in oracle_trajectories())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(m["adapter_delta_norm"] > 0 for m in lines)
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    lora_b = {k: v for k, v in load_file(last / "student_params.safetensors").items() if "lora_B" in k}
    assert lora_b and any(bool(v.abs().sum() > 0) for v in lora_b.values())  # B starts at zero
    return lines


def test_sft_trains_on_the_oracle_trajectories(
    cli: Callable[..., CliResult], write_config: Callable[..., Path], workdir: Path
) -> None:
    config = tiny_config(_oracle_rows_and_model(workdir), algorithm="sft")
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


def test_kd_update_on_the_8_oracle_trajectories_moves_the_adapter(
    cli: Callable[..., CliResult], write_config: Callable[..., Path], workdir: Path
) -> None:
    """Offline KD: the student matches the teacher's distribution on the oracle responses; the teacher is the
    frozen base that also sees the worked answer (without it, teacher and fresh student agree: no gradient)."""
    config = tiny_config(_oracle_rows_and_model(workdir), algorithm="kd")
    config["models"]["teacher"] = {"source": "student", "privileged_context": {"column": "context"}}
    config["algorithm"]["offline"] = {"target_column": "context"}
    config["algorithm"]["rewards"] = [{"name": "sql_result_match", "weight": 1.0}]
    config["rollout"].update({"prompts_per_cycle": 8, "samples_per_prompt": 1})
    config["train"]["cycles"] = 1
    write_config(config)
    planned = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert planned.code == 0, planned.err
    result = cli("run", "--plan", "plan.json", "--run-id", "kd", "--json")
    assert result.code == 0, result.err
    (line,) = _trained_on_every_oracle_row(workdir, "kd")
    assert line["loss"] > 0 and line["algorithm_metrics"]["kd/divergence"] == line["loss"]
    assert result.json()["summary"]["adapter_changed_each_update"] is True


def test_strict_opd_update_on_the_8_oracle_prompts_is_teacher_scored_and_moves_the_adapter(
    cli: Callable[..., CliResult], write_config: Callable[..., Path], workdir: Path
) -> None:
    """Strict OPD: the student samples on the 8 oracle prompts; the teacher (the frozen base that sees the oracle
    response, in the worked answer, before the prompt) scores those samples; exact reverse KL, one update."""
    config = tiny_config(_oracle_rows_and_model(workdir), algorithm="opd")
    assert config["models"]["teacher"]["privileged_context"]["column"] == "context"
    config["algorithm"]["distill"] = {"objective": "exact", "divergence": "reverse_kl"}
    config["algorithm"]["rewards"] = [{"name": "sql_result_match", "weight": 1.0}]
    config["rollout"].update({"prompts_per_cycle": 8, "samples_per_prompt": 1, "max_new_tokens": 4})
    config["train"]["cycles"] = 1
    write_config(config)
    planned = cli("plan", "config.yaml", "--out", "plan.json", "--json")
    assert planned.code == 0, planned.err
    result = cli("run", "--plan", "plan.json", "--run-id", "opd", "--json")
    assert result.code == 0, result.err
    (line,) = _trained_on_every_oracle_row(workdir, "opd")
    assert line["loss"] > 0 and line["kl"] > 0
    assert result.json()["summary"]["adapter_changed_each_update"] is True
