"""Tasks as config: records of each task, chat-template prompts, the held-out loader, config errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from grpo_lightning.config import ConfigError, TrainConfig, validate_config
from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.tasks import ReasoningGymTaskConfig, task_records
from grpo_lightning.tasks.gsm import final_answer, gsm_records
from grpo_lightning.train import CONF_DIR, to_train_config


def test_gsm_task_has_the_hundred_questions_with_numeric_answers():
    train, val = gsm_records(size=100, seed=0, val_fraction=0.2)
    assert (len(train), len(val)) == (80, 20)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    for record in train + val:
        assert record["prompt"].endswith("?") or len(record["prompt"]) > 40
        float(record["answer"])  # every answer parses as a number
    assert final_answer("so 2 + 2 = 4\n#### 1,204\n") == "1204"
    with pytest.raises(ValueError, match="no '#### answer'"):
        final_answer("no final line")


def test_reasoning_gym_task_from_config_is_reproducible_and_split():
    task = ReasoningGymTaskConfig(dataset="chain_sum", size=50, val_fraction=0.2, max_completion_chars=80)
    train, val = task_records(task)
    assert (len(train), len(val)) == (40, 10)
    assert all(r["entry"]["metadata"]["source_dataset"] == "chain_sum" for r in train)
    assert all(r["max_completion_chars"] == 80 for r in train + val)
    again, _ = task_records(task)
    assert [r["prompt"] for r in again] == [r["prompt"] for r in train]
    other, _ = task_records(ReasoningGymTaskConfig(dataset="chain_sum", size=50, val_fraction=0.2, seed=1))
    assert [r["prompt"] for r in other] != [r["prompt"] for r in train]


def test_unknown_reasoning_gym_dataset_names_the_field():
    with pytest.raises(ValueError, match="task.dataset='no_such_dataset'"):
        task_records(ReasoningGymTaskConfig(dataset="no_such_dataset", size=4))


CHAT = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_formatter_applies_the_chat_template_with_system_prompt_and_instruction():
    tokenizer = build_char_tokenizer("0123456789+-*=? <>/abcdefghijklmnopqrstuvwxyz")
    tokenizer.chat_template = CHAT
    formatter = PromptFormatter(tokenizer, system_prompt="be brief", instruction="answer in tags")
    text = formatter.text("1+2=?")
    assert text == "<system>be brief</system><user>1+2=?\nanswer in tags</user><assistant>"
    assert formatter("1+2=?") == tokenizer(text, add_special_tokens=False)["input_ids"]
    plain = PromptFormatter(tokenizer, system_prompt="be brief", use_chat_template=False)
    assert plain.text("1+2=?") == "1+2=?"


def test_formatter_without_a_template_tokenizes_the_raw_prompt():
    tokenizer = build_char_tokenizer()
    formatter = PromptFormatter(tokenizer, system_prompt="ignored without a template")
    assert not formatter.uses_chat_template
    assert formatter("3+4=") == tokenizer("3+4=", add_special_tokens=True)["input_ids"]


def test_validation_loader_yields_held_out_records_in_order():
    train = [{"prompt": f"{i}+0=", "answer": str(i)} for i in range(8)]
    val = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(5)]
    dm = PromptDataModule(train, val, prompts_per_step=4, val_batch_size=2)
    batches = list(dm.val_dataloader())
    assert [len(b) for b in batches] == [2, 2, 1]
    assert [r["prompt"] for b in batches for r in b] == [r["prompt"] for r in val]


def test_config_rejects_bad_task_and_eval_fields():
    cfg = TrainConfig()
    cfg.task.name = "mmlu"
    cfg.task.correctness_reward = "accuracy"
    cfg.eval.pass_k = -1
    cfg.eval.batch_size = 0
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    message = str(err.value)
    assert "task.name='mmlu' is not a registered task" in message and "reasoning_gym" in message
    assert "task.correctness_reward='accuracy' is not a registered reward function" in message
    assert "eval.pass_k=-1" in message and "eval.batch_size=0" in message


@pytest.mark.parametrize(
    "task, rewards, correctness",
    [
        ("arithmetic", {"arithmetic_exact": 0.5, "arithmetic_close": 0.5}, "arithmetic_exact"),
        ("reasoning_gym", {"reasoning_gym": 1.0, "answer_format": 0.2, "length_penalty": 0.2}, "reasoning_gym"),
        ("gsm", {"gsm_exact": 1.0, "answer_format": 0.2, "length_penalty": 0.2}, "gsm_exact"),
    ],
)
def test_each_task_group_composes_with_exactly_its_own_rewards(task, rewards, correctness):
    """Hydra merges dicts: no default reward may leak from the schema into another task."""
    cfg = compose_train(f"task={task}")
    assert cfg.task.name == task
    assert cfg.task.rewards == rewards
    assert cfg.task.correctness_reward == correctness
    validate_config(cfg)


def compose_train(*overrides: str) -> TrainConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return to_train_config(compose(config_name="train", overrides=["trainer.output_dir=out", *overrides]))


ARITHMETIC = {"arithmetic_exact": 0.5, "arithmetic_close": 0.5}
GSM = {"gsm_exact": 1.0, "answer_format": 0.2, "length_penalty": 0.2}


@pytest.mark.parametrize(
    "overrides, rewards",
    [
        (["+task.rewards={gsm_exact:1.0}"], {**ARITHMETIC, "gsm_exact": 1.0}),
        (["+task.rewards.answer_format=0.1"], {**ARITHMETIC, "answer_format": 0.1}),
        (["task.rewards.arithmetic_exact=0.7"], {**ARITHMETIC, "arithmetic_exact": 0.7}),
        (["task=gsm", "task.rewards={gsm_exact:2.0}"], {**GSM, "gsm_exact": 2.0}),
        (["task=gsm", "~task.rewards.length_penalty"], {"gsm_exact": 1.0, "answer_format": 0.2}),
    ],
)
def test_reward_overrides_merge_into_the_tasks_own_rewards(overrides, rewards):
    """On the command line a rewards dict extends or re-weights the task's rewards; ~ removes one."""
    assert compose_train(*overrides).task.rewards == rewards


@pytest.mark.slow
def test_cli_config_of_a_task_shows_only_its_own_rewards(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "grpo_lightning.train", "task=reasoning_gym", "--cfg", "job"],
        cwd=tmp_path,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shown = OmegaConf.create(result.stdout)
    assert OmegaConf.to_container(shown.task.rewards) == {
        "reasoning_gym": 1.0,
        "answer_format": 0.2,
        "length_penalty": 0.2,
    }
