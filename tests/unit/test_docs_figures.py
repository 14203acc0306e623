"""The first-run figures the README and the example config state come from one committed measurement (issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.docs_generator import load_generator

REPO = Path(__file__).resolve().parents[2]
MEASUREMENT = REPO / "docs" / "measurements" / "2026-12-06-first-run-memory"


def _expected() -> dict[str, str]:
    figures = json.loads((MEASUREMENT / "figures.json").read_text())
    greedy, sampled = figures["heldout"]["greedy"], figures["heldout"]["sampled"]
    return {
        "peak": f"{figures['run']['peak_rss_bytes'] / 1e9:.1f} GB",
        "run": f"{figures['run']['wall_seconds'] / 60:.0f} minutes",
        "eval": f"{figures['eval']['wall_seconds'] / 60:.1f} minutes",
        "greedy": f"{greedy['base']:.3f} to {greedy['trained']:.3f}",
        "sampled": f"{sampled['base']:.3f} to {sampled['trained']:.3f}",
    }


def test_readme_figures_are_the_measurements() -> None:
    readme = (REPO / "README.md").read_text()
    paragraph = readme[readme.index("**What to expect**") :].split("\n\n", 1)[0]
    expected = _expected()
    assert f"peak memory {expected['peak']}" in paragraph
    assert f"`run` {expected['run']}" in paragraph and f"`eval` {expected['eval']}" in paragraph
    assert f"from\n{expected['greedy']} greedy" in paragraph or f"from {expected['greedy']} greedy" in paragraph
    assert f"{expected['sampled']} sampled" in paragraph


def test_example_config_states_the_measured_peak() -> None:
    text = (REPO / "miniverl" / "examples" / "grpo" / "config.yaml").read_text()
    assert f"about {_expected()['peak']} peak RSS on CPU" in text
    assert (MEASUREMENT / "README.md").is_file() and "docs/measurements/2026-12-06-first-run-memory/" in text


VERL_ATTEMPTS = (
    "attempt-1-flash-attn",
    "attempt-2-lora-sync",
    "attempt-3-fsdp1-lora-gather",
    "attempt-4-fsdp2-two-steps",
)


def test_the_verl_handoff_records_miniverl_rows_are_its_metrics() -> None:
    """The verl handoff record's table of miniverl's own cycles is each attempt's committed metrics, line for line."""
    record = REPO / "docs" / "measurements" / "2026-12-06-h100-verl-handoff"
    readme = (record / "README.md").read_text()
    for attempt in VERL_ATTEMPTS:
        for line in (record / attempt / "miniverl-metrics.jsonl").read_text().splitlines():
            m = json.loads(line)
            row = (
                f"| {m['cycle']} | {m['reward_mean']:.4f} | {m['kl']:.3g} | {m['loss']:.4f} | {m['response_tokens']} "
                f"| {m['rollout_backend']} |"
            )
            assert row in readme, row


def test_the_verl_handoff_records_step_figures_are_its_records() -> None:
    """Each attempt's row: prepare's exit codes and seconds are prepare.json's, the launch's are handoff.json's."""
    record = REPO / "docs" / "measurements" / "2026-12-06-h100-verl-handoff"
    rows = [line for line in (record / "README.md").read_text().splitlines() if line.startswith("| ")]
    for attempt in VERL_ATTEMPTS:
        (row,) = [line for line in rows if f"(`{attempt}/`)" in line]
        steps = json.loads((record / attempt / "prepare.json").read_text())["steps"]
        assert all(step["exit_code"] == 0 for step in steps.values())
        assert f"every step exit 0 ({round(sum(step['seconds'] for step in steps.values()))} s of steps)" in row
        launch = json.loads((record / attempt / "handoff.json").read_text())["steps"]["launch"]
        code = launch["exit_code"]
        assert (f"(exit {code})" if code == 124 else f"exit {code} after {round(launch['seconds'])} s") in row


def test_the_verl_handoff_records_verl_steps_are_its_launch_metrics() -> None:
    """verl's rows (attempt 4) are handoff.json's steps, and those are the metrics lines verl printed in launch.log."""
    record = REPO / "docs" / "measurements" / "2026-12-06-h100-verl-handoff"
    attempt = record / "attempt-4-fsdp2-two-steps"
    readme = (record / "README.md").read_text()
    handoff = json.loads((attempt / "handoff.json").read_text())
    assert handoff["completed"] is True and handoff["steps"]["launch"]["exit_code"] == 0
    assert [step["step"] for step in handoff["verl"]] == [1, 2] == list(range(1, handoff["steps_wanted"] + 1))
    log = (attempt / "launch.log").read_text()
    for step in handoff["verl"]:
        m = step["all"]
        (printed,) = [line for line in log.splitlines() if f" step:{step['step']} - " in line]
        for key in ("critic/rewards/mean", "actor/kl_loss", "actor/pg_loss", "response_length/mean"):
            assert f"{key}:{m[key]!r}" in printed, key
        row = (
            f"| {step['step']} | {m['critic/rewards/mean']:.4f} | {m['actor/kl_loss']:.2g} | {m['actor/pg_loss']:.4f} "
            f"| {m['response_length/mean']:.1f} | {m['training/rollout_probs_diff_max']:.3g} / "
            f"{m['training/rollout_probs_diff_mean']:.3g} | {m['actor/perf/max_memory_reserved_gb']:.2f} GiB |"
        )
        assert row in readme, row


def test_the_2026_12_07_update_record_is_its_three_runs() -> None:
    """Every figure of the 2026-12-07 update table (median, range, peak, speed vs naive) is its run's grpo.json, as
    the generated benchmark page formats it."""
    record = REPO / "docs" / "measurements" / "2026-12-07-h100-perf"
    readme = (record / "README.md").read_text()
    reports = [json.loads((record / f"update-run-{run}" / "grpo.json").read_text()) for run in (1, 2, 3)]
    for path, *timings, speeds, _memory in load_generator().update_run_rows(reports):
        for figure in timings:
            assert figure in readme, (path, figure)
        if path != "naive_hf_peft":
            assert speeds in readme, path


def test_the_2026_12_07_nf4_figures_are_its_grpo_json() -> None:
    """The NF4 step's hand-typed figures (median and range, tokens/s, rollout and update, peak, the plan's estimate)
    are its committed cell's."""
    record = REPO / "docs" / "measurements" / "2026-12-07-h100-perf"
    readme = (record / "README.md").read_text()
    (cell,) = json.loads((record / "nf4-1gib" / "grpo.json").read_text())["cells"]
    spread = cell["spread_step_seconds"]
    assert (
        f"{cell['ms_per_step']:,.0f} ms ({spread['min'] * 1e3:,.0f}-{spread['max'] * 1e3:,.0f}): "
        f"{cell['completion_tokens_per_second']:.0f} completion tokens/s"
    ) in readme
    assert f"{cell['median_rollout_seconds'] * 1e3:,.0f} ms / {cell['median_update_seconds'] * 1e3:,.0f} ms" in readme
    assert f"**{cell['peak_reserved_gib']:.2f} GiB**" in readme
    assert f"estimated {cell['estimated_peak_gib']:.2f} GiB" in readme
    plan = cell["memory_plan"]
    assert f"all {plan['memory_plan/checkpointed_layers']:.0f} layers checkpointed" in readme
    assert f"micro-batch {plan['memory_plan/micro_rows']:.0f} rows" in readme
    assert f"log-prob chunk {plan['memory_plan/logprob_chunk']:.0f} rows" in readme
