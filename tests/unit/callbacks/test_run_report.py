"""RunReport's files from a history, without a run: the summary's best and final values, the
samples file, the picture; and the progress bar's fields."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import torch

from grpo_lightning.callbacks import report_plot, run_report
from grpo_lightning.callbacks.progress import RunProgress
from grpo_lightning.callbacks.run_report import RunReport, output_lines
from grpo_lightning.health import Alert
from grpo_lightning.records import RolloutBatch


def fake_trainer(step: int):
    return SimpleNamespace(global_step=step, loggers=[], is_global_zero=True, callback_metrics={})


def history(n: int) -> list[dict]:
    return [
        {
            "step": i + 1,
            "batch": i,
            "reward/mean": math.sin(i) ** 2,
            "reward/fmt/mean": 0.5,
            "kl/mean": 0.01 * i,
            "policy/entropy": 2.0 - 0.01 * i,
            "completions/mean_length": 10.0,
            "completions/min_length": 5.0,
            "completions/max_length": 20.0,
            "train/step_time": 0.1,
            "train/lr": 1e-5,
            "num_tokens": 100.0 * (i + 1),
        }
        for i in range(n)
    ]


def four_completions(**fields) -> RolloutBatch:
    """Two prompts x two completions of two tokens each."""
    n = 4
    return RolloutBatch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=torch.ones(n, 2, dtype=torch.long),
        completion_mask=torch.ones(n, 2, dtype=torch.long),
        group_size=2,
        max_new_tokens=2,
        temperature=1.0,
        prompts=["p0", "p0", "p1", "p1"],
        completions=["a", "b", "c", "d"],
        **fields,
    )


def test_summary_picks_best_and_final_values_and_places_alerts_at_their_optimizer_step(tmp_path, monkeypatch):
    drawn = []  # the picture itself is drawn in tests/integration/test_run_outputs.py (matplotlib takes seconds)
    monkeypatch.setattr(run_report, "draw_report", lambda *args: drawn.append(args))
    health = SimpleNamespace(alerts=[Alert("entropy", "F1", "collapse", 4, "evidence", "causes", "fix")])
    report = RunReport(tmp_path, health=health)
    report.history = history(12)
    report.validations = [
        {"step": 0, "val/accuracy": 0.2},
        {"step": 6, "val/accuracy": 0.5},
        {"step": 12, "val/accuracy": 0.4},
    ]
    summary = report.write(fake_trainer(12), "finished")
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    best_reward = max(report.history, key=lambda r: r["reward/mean"])
    assert summary["best"]["reward/mean"] == {"value": best_reward["reward/mean"], "step": best_reward["step"]}
    assert summary["best"]["val/accuracy"] == {"value": 0.5, "step": 6}
    assert summary["final"]["val/accuracy"] == 0.4 and summary["final"]["num_tokens"] == 1200.0
    assert summary["alerts"][0]["step"] == 5 and summary["alerts"][0]["generation_batch"] == 4
    assert summary["held_out"] == {"before": report.validations[0], "after": report.validations[-1]}
    path, rows, validations, alerts, _ = drawn[0]
    assert path == tmp_path / "report.png" and rows is report.history and alerts[0]["step"] == 5
    assert [line.split()[0] for line in output_lines(summary)] == ["report", "summary"]


def test_report_png_off_writes_the_summary_and_neither_draws_nor_lists_the_picture(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(run_report, "draw_report", lambda *args: drawn.append(args))
    report = RunReport(tmp_path, draw=False)
    report.history = history(3)
    summary = report.write(fake_trainer(3), "finished")
    assert drawn == [] and not (tmp_path / "report.png").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == summary["steps"]
    assert [line.split()[0] for line in output_lines(summary)] == ["summary"]


def test_samples_are_appended_as_json_lines_with_each_functions_score(tmp_path):
    rollout = four_completions(
        rewards=torch.tensor([1.0, 0.0, 0.5, 0.5]),
        step=3,
        reward_components={"exact": torch.tensor([1.0, 0.0, math.nan, 1.0])},
    )
    report = RunReport(tmp_path, max_rows=3)
    report.write_samples(rollout, torch.tensor([1.0, -1.0, 0.0, 0.0]))
    report.write_samples(rollout, torch.tensor([1.0, -1.0, 0.0, 0.0]))
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    assert rows[0] == {
        "step": 3,
        "prompt": "p0",
        "completion": "a",
        "reward": 1.0,
        "advantage": 1.0,
        "rewards": {"exact": 1.0},
    }
    assert rows[2]["rewards"] == {"exact": None}  # the function did not apply: null, not NaN (invalid JSON)


def test_samples_carry_the_log_extra_columns_beside_their_completion(tmp_path):
    rollout = four_completions(
        rewards=torch.zeros(4),
        # what TRL-style rewards gave log_extra: a column per name, one value per completion
        reward_extra={
            "parsed": ["a!", "b!", "c!", "d!"],
            "prompt": ["x0", "x1", "x2", "x3"],
            "score": [0.5, math.nan, None, 2],
        },
    )
    RunReport(tmp_path, max_rows=4).write_samples(rollout, torch.zeros(4))
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [r["parsed"] for r in rows] == [r["completion"] + "!" for r in rows]
    assert [r["prompt"] for r in rows] == ["p0", "p0", "p1", "p1"]  # ours kept; theirs beside it
    assert [r["log_extra/prompt"] for r in rows] == ["x0", "x1", "x2", "x3"]
    assert [r["score"] for r in rows] == [0.5, None, None, 2]


def test_the_progress_bar_shows_reward_kl_and_the_last_accuracy():
    module = SimpleNamespace(last_metrics={"reward/mean": 0.123456, "kl/mean": 0.001, "train/loss": 3.0})
    trainer = SimpleNamespace(callback_metrics={"val/accuracy": torch.tensor(0.75)})
    assert RunProgress().get_metrics(trainer, module) == {"reward": "0.123", "kl": "0.001", "acc": "0.75"}


def test_the_episode_panels_show_stop_shares_and_only_the_tool_outcomes_that_happened():
    p = "rollout/episodes/"
    history = [
        {"step": 1, p + "count": 8.0, p + "turns": 3.0, p + "stop/done": 6.0, p + "stop/max_turns": 2.0},
        {"step": 2, p + "count": 4.0, p + "turns": 2.5, p + "stop/done": 4.0, p + "stop/max_turns": 0.0},
    ]
    for row in history:
        row |= {p + "tool/exception": 0.0, p + "tool/timeout": 0.25 * row["step"]}
    panels = {title: keys for title, keys in report_plot.EPISODE_PANELS}
    stops = report_plot.episode_series(history, panels["episodes: stop reasons (share)"])
    assert stops == {"stop/done": ([1, 2], [0.75, 1.0]), "stop/max_turns": ([1, 2], [0.25, 0.0])}
    tools = report_plot.episode_series(history, panels["episodes: tool outcomes (per episode)"])
    assert list(tools) == ["tool/timeout"]  # exception never happened: no line
    assert report_plot.episode_series(history, ("turns",)) == {"turns": ([1, 2], [3.0, 2.5])}
