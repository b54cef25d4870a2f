"""TRL's reward-function convention (issue 28): keyword calls, plain functions looked up by name in
task.reward_modules, pkg.module:function paths, async rewards under a running loop, log callbacks."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import pytest

from grpo_lightning.config import ConfigError, TrainConfig, validate_config
from grpo_lightning.config.compose import compose
from grpo_lightning.errors import DataError
from grpo_lightning.rewards import RewardFunctionError, RewardScorer, RewardState, find_reward
from grpo_lightning.rewards.columns import check_reward_columns, repeat_columns

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
TRL_FILE = str(HELPERS / "trl_style_rewards.py")
OUT = "trainer.output_dir=/tmp/unused"
PROMPTS = ["3+4=", "3+4=", "10+1=", "10+1="]
COLUMNS = {"question": PROMPTS, "solution": ["7", "7", "11", "11"]}


def scorer_for(names, **weights):
    return RewardScorer.from_names({n: weights.get(n, 1.0) for n in names}, modules=[TRL_FILE])


def score(scorer, prompts=PROMPTS, completions=("7", "12", "11", "x"), step=3):
    return scorer(
        list(prompts),
        list(completions),
        dict(COLUMNS),
        completion_ids=[[5] * len(c) for c in completions],
        trainer_state=RewardState(global_step=step, epoch=0.5, max_steps=10),
    )


def test_trl_style_functions_are_called_by_keyword_with_every_column():
    total, parts = score(scorer_for(["accuracy", "reward_len", "format_reward", "sometimes_none", "overlong"]))
    assert parts["accuracy"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert parts["reward_len"].tolist() == [-19.0, -18.0, -18.0, -19.0]
    assert parts["format_reward"].tolist() == [1.0, 1.0, 1.0, 0.0]
    none = parts["sometimes_none"].tolist()  # 7 and 11 are odd: it applies to every row here
    assert none == [1.0, 0.0, 0.0, 0.0]
    assert parts["overlong"].tolist() == [0.0, 0.0, 0.0, 0.0]  # 1-2 tokens: within 4 - 2
    assert total.tolist() == pytest.approx([1 - 19 + 1 + 1, -18 + 1, 1 - 18 + 1, -19])


def test_none_means_not_applicable_and_a_row_nobody_scores_is_named():
    s = scorer_for(["sometimes_none", "format_reward"])
    _, parts = s(
        ["1+1="], ["2"], {"question": ["1+1="], "solution": ["2"]}, completion_ids=[[5]], trainer_state=RewardState(0)
    )
    assert parts["sometimes_none"].isnan().all() and parts["format_reward"].tolist() == [1.0]
    alone = scorer_for(["sometimes_none"])
    with pytest.raises(RewardFunctionError, match=r"no reward function applies to sample 0 \(prompt '1\+1='\)"):
        alone(
            ["1+1="],
            ["2"],
            {"question": ["1+1="], "solution": ["2"]},
            completion_ids=[[5]],
            trainer_state=RewardState(0),
        )


def test_trainer_state_and_the_log_callbacks_reach_the_function():
    seen = {}

    def watcher(completions, trainer_state, log_metric, log_extra, **kwargs):
        seen.update(step=trainer_state.global_step, epoch=trainer_state.epoch, max_steps=trainer_state.max_steps)
        log_metric("watched", 2.0)
        log_metric("watched", 4.0)
        log_extra("length", [len(c) for c in completions])
        return [0.0] * len(completions)

    s = RewardScorer.from_names({"watcher": 1.0}, functions={"watcher": watcher})
    score(s)
    assert seen == {"step": 3, "epoch": 0.5, "max_steps": 10}
    assert s.last_logs.metrics == {"reward/watched": 3.0}
    assert s.last_logs.extra == {"length": [1, 2, 2, 1]}


def test_async_rewards_run_concurrently_even_inside_a_running_event_loop():
    """A notebook's cell runs inside a loop: asyncio.run would raise there."""
    started = asyncio.Event()

    async def waits(completions, **_):
        await asyncio.wait_for(started.wait(), timeout=5)
        return [1.0] * len(completions)

    async def starts(completions, **_):
        started.set()
        return [2.0] * len(completions)

    s = RewardScorer.from_names({"waits": 1.0, "starts": 1.0}, functions={"waits": waits, "starts": starts})

    async def notebook_cell():
        return score(s)

    total, _ = asyncio.run(notebook_cell())
    assert total.tolist() == [3.0] * 4
    total, parts = score(scorer_for(["async_reward"]))  # and outside a loop, the file's async reward
    assert parts["async_reward"].tolist() == [0.5, 1.0, 1.0, 0.5]


def test_the_older_positional_convention_still_works():
    s = RewardScorer.from_names(
        {"old": 1.0},
        functions={"old": lambda p, c, solution, **_: [float(x == y) for x, y in zip(c, solution, strict=True)]},
    )
    assert score(s)[0].tolist() == [1.0, 0.0, 1.0, 0.0]


def test_a_column_named_like_an_argument_is_refused():
    s = scorer_for(["reward_len"])
    with pytest.raises(RewardFunctionError, match="column named 'trainer_state'"):
        s(["1+1="], ["2"], {"trainer_state": [1]})


def test_plain_and_factory_built_functions_resolve_by_name_and_a_miss_lists_the_callables(tmp_path):
    assert find_reward("accuracy", [TRL_FILE]).__name__ == "accuracy"
    assert find_reward("overlong", [TRL_FILE]).__name__ == "soft_overlong_punishment"
    with pytest.raises(ConfigError) as err:
        find_reward("acuracy", [TRL_FILE], field="task.rewards.acuracy")
    message = str(err.value)
    assert "task.rewards.acuracy='acuracy' is not a registered reward function" in message
    assert "did you mean 'accuracy'?" in message and "'reward_len'" in message and "'overlong'" in message
    with pytest.raises(ConfigError, match="is a class, not a reward function"):
        find_reward("RewardState", [str(tmp_file(tmp_path, "from grpo_lightning.rewards import RewardState"))])


def tmp_file(folder, text, name="more_rewards_trl.py"):
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_name_defined_twice_differently_is_an_error_naming_both(tmp_path):
    other = tmp_file(tmp_path, "def answer_format(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    with pytest.raises(ConfigError, match="names different functions in .*more_rewards_trl.py and the registered"):
        find_reward("answer_format", [str(other)])
    same = tmp_file(tmp_path, "from grpo_lightning.rewards.generic import answer_format\n", "same_rewards_trl.py")
    assert find_reward("answer_format", [str(same)]) is find_reward("answer_format")


def test_an_import_path_names_a_function_of_an_installed_module(tmp_path, monkeypatch):
    tmp_file(
        tmp_path,
        "def shout(completions, **kwargs):\n    return [float(c.isupper()) for c in completions]\n",
        "trl_pathmod.py",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_reward("trl_pathmod:shout")(completions=["A", "b"]) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="'trl_pathmod' has no attribute 'whisper'; its callables: \\['shout'\\]"):
        find_reward("trl_pathmod:whisper")
    overrides = [OUT, "logger=none", r"task.rewards={trl_pathmod\:shout: 1.0}", "task.correctness_reward=null"]
    cfg, _ = compose(overrides)  # Hydra's grammar needs the colon escaped
    assert cfg.task.rewards == {"trl_pathmod:shout": 1.0}
    validate_config(cfg)


def test_the_cli_names_plain_functions_of_reward_modules_and_refuses_unknown_ones():
    cfg, _ = compose(
        [OUT, f"task.reward_modules=[{TRL_FILE}]", "task.rewards={accuracy: 1.0, reward_len: 0.1, overlong: 1.0}"]
    )
    validate_config(cfg)
    cfg.task.rewards = {"helper_notareward": 1.0}
    with pytest.raises(ConfigError, match="did you mean 'helper_not_a_reward'"):
        validate_config(cfg)
    with pytest.raises(ConfigError, match="is not a registered reward function"):
        validate_config(TrainConfig(**{"task": type(TrainConfig().task)(rewards={"accuracy": 1.0})}))


def test_required_columns_of_trl_signatures_are_checked_against_the_data():
    with pytest.raises(DataError, match="reward 'accuracy' needs the column 'solution'"):
        check_reward_columns(["accuracy"], [{"prompt": "1+1=", "question": "1+1="}], "data.jsonl", [TRL_FILE])
    check_reward_columns(["accuracy", "reward_len"], [{"prompt": "1+1=", "solution": "2"}], "data.jsonl", [TRL_FILE])


def test_repeat_columns_keeps_each_value_with_its_record():
    records = [{"prompt": "a", "x": 1}, {"prompt": "b", "y": 2}]
    assert repeat_columns(records, 2) == {"x": [1, 1, None, None], "y": [None, None, 2, 2]}


@pytest.mark.slow
def test_under_a_time_limit_a_factory_built_reward_runs_in_the_worker_and_its_logs_come_back():
    """A closure has no importable name of its own; the worker finds it as the file's attribute."""
    s = RewardScorer.from_names({"overlong": 1.0}, timeout_s=120, modules=[TRL_FILE])
    try:
        _, parts = score(s, completions=("7", "1234", "11", "x"))
        assert parts["overlong"].tolist() == [0.0, -1.0, 0.0, 0.0]  # 4 tokens: the whole budget
        assert s.last_logs.metrics == {"reward/overlong_calls": 1.0}  # log_metric, replayed from the worker
    finally:
        for reward in s.rewards:
            reward.fn.close()
