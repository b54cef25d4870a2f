"""TRL's GRPOConfig names: aliases compose exactly as our keys, the others fail naming ours, and
docs/trl_migration.md holds the table the code reads (one source of truth)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from grpo_lightning.config import ConfigError, TrainConfig, UnknownFieldError
from grpo_lightning.config.base import schema_keys
from grpo_lightning.config.compose import compose, trl_overrides
from grpo_lightning.config.trl_names import TRL_NAMES, migration_table, trl_problem
from grpo_lightning.environments.limits import EpisodeTaskConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "trl_migration.md"
OUT = "trainer.output_dir=/tmp/unused"
# Our keys, the options of episode tasks among them (max_tool_calling_iterations maps to task.max_turns).
KEYS = set(schema_keys(TrainConfig)) | {f"task.{f.name}" for f in fields(EpisodeTaskConfig)}


def test_the_migration_page_holds_the_table_the_code_reads():
    text = DOC.read_text()
    table = text.split("<!-- trl-table:start -->\n", 1)[1].split("<!-- trl-table:end -->", 1)[0]
    assert table == migration_table(), "docs/trl_migration.md is stale: paste migration_table() between the markers"


@pytest.mark.parametrize("name", sorted(TRL_NAMES))
def test_every_mapping_names_a_real_key_of_ours(name):
    entry = TRL_NAMES[name]
    assert entry.ours is None or entry.ours in KEYS
    assert not entry.alias or entry.ours is not None


@pytest.mark.parametrize("name", sorted(n for n, e in TRL_NAMES.items() if e.alias))
def test_an_alias_is_renamed_to_our_key(name):
    assert trl_overrides([f"{name}=7"], say=False) == [f"{TRL_NAMES[name].ours}=7"]


def test_an_alias_composes_exactly_as_our_key():
    assert (
        compose([OUT, "learning_rate=1e-6", "max_completion_length=12", "epsilon_high=0.28"])[0]
        == compose([OUT, "algorithm.lr=1e-6", "rollout.max_new_tokens=12", "algorithm.clip_high=0.28"])[0]
    )


@pytest.mark.parametrize("name", sorted(n for n, e in TRL_NAMES.items() if not e.alias))
def test_a_name_with_another_meaning_fails_naming_ours(name):
    with pytest.raises(ConfigError) as err:
        compose([OUT, f"{name}=1"])
    ours = TRL_NAMES[name].ours
    assert (f"did you mean {ours}?" if ours else "we lack it") in str(err.value)


def test_the_batch_size_trap_is_spelled_out_with_the_value_to_write():
    message = trl_problem("per_device_train_batch_size", 64)
    assert "rollout.prompts_per_step=8" in message and "completions" in message


@pytest.mark.parametrize(
    "override, expected",
    [
        ("loss_type=dr_grpo", "algorithm.loss_agg=seq_mean_token_sum_norm"),
        ("scale_rewards=false", "algorithm.advantage_scale=none"),
        ("use_vllm=true", "rollout.engine=vllm"),
        ("bf16=true", "trainer.precision=bf16-mixed"),
        ("epsilon=0.1", "algorithm.clip_low=0.1 algorithm.clip_high=0.1"),
    ],
)
def test_value_translations_name_the_override_to_write(override, expected):
    with pytest.raises(ConfigError, match=expected):
        compose([OUT, override])


def test_a_typo_of_a_trl_name_points_to_our_key():
    with pytest.raises(ConfigError, match=r"learning_rat is not a config field; did you mean algorithm.lr\?"):
        compose([OUT, "learning_rat=1e-6"])


def test_python_attribute_with_a_trl_name_points_to_our_attribute():
    with pytest.raises(UnknownFieldError, match=r"cfg.algorithm.lr \(learning_rate is TRL's name\)"):
        TrainConfig().learning_rate = 1e-6
