"""build_run takes objects as TRL's GRPOTrainer does: a loaded model and tokenizer, a
datasets.Dataset, reward callables, a PEFT LoraConfig and callbacks; one short run trains on them."""

from __future__ import annotations

import datasets
import lightning as L
import pytest
from peft import LoraConfig

from grpo_lightning.build import build_run, fit
from grpo_lightning.config import ConfigError, TrainConfig
from grpo_lightning.errors import DataError
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS
from grpo_lightning.run_objects import take_objects

SEEN: list[str] = []


@pytest.fixture(autouse=True)
def _forget_given_rewards():
    """The reward functions registered here leave the registry with the test (others list it)."""
    yield
    REWARD_FUNCTIONS.entries.pop("exact_sum", None)


def exact_sum(prompts, completions, solution, **kwargs):
    SEEN.extend(solution)
    return [float(c.strip() == s) for c, s in zip(completions, solution, strict=True)]


class CountSteps(L.Callback):
    def __init__(self):
        self.steps = 0

    def on_train_batch_end(self, *args, **kwargs):
        self.steps += 1


def _cfg(tmp_path) -> TrainConfig:
    cfg = TrainConfig()
    cfg.trainer.output_dir, cfg.trainer.max_steps, cfg.logger.kind = str(tmp_path), 2, "none"
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations, cfg.health.enabled = 2, 4, False
    return cfg


def test_a_run_built_from_objects_trains_on_them(tmp_path):
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    data = datasets.Dataset.from_list([{"prompt": f"{a}+{a}=", "solution": str(2 * a)} for a in range(10)])
    counter = CountSteps()
    cfg = _cfg(tmp_path)
    run = build_run(
        cfg,
        model=policy,
        tokenizer=tokenizer,
        train_dataset=data,
        reward_funcs=[exact_sum],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        callbacks=[counter],
    )
    assert cfg.task.rewards == {"exact_sum": 1.0} and cfg.task.correctness_reward is None
    assert (cfg.model.lora.rank, cfg.model.lora.target_modules) == (4, ["q_proj", "v_proj"])
    assert type(run.module.policy).__name__.startswith("Peft")
    fit(run, run.trainer(cfg), cfg)
    assert counter.steps == 2
    assert set(SEEN) <= {str(2 * a) for a in range(10)} and len(SEEN) == 2 * 2 * 4


def test_objects_set_the_config_fields_they_stand_for():
    cfg = TrainConfig()
    cfg.task.rewards = {"exact_sum": 0.5}
    objects = take_objects(cfg, model="smollm2_135m", reward_funcs={"exact_sum": exact_sum}, train_dataset=[])
    assert cfg.model.name_or_path == "smollm2_135m" and objects.policy is None
    assert cfg.task.rewards == {"exact_sum": 0.5}  # a weight set before is kept
    assert REWARD_FUNCTIONS["exact_sum"] is exact_sum

    def exact_sum_again(prompts, completions, **kwargs):  # a notebook cell run twice
        return [0.0] * len(completions)

    take_objects(cfg, reward_funcs={"exact_sum": exact_sum_again})
    assert REWARD_FUNCTIONS["exact_sum"] is exact_sum_again


@pytest.mark.parametrize(
    "kwargs, error, said",
    [
        ({"model": object()}, ConfigError, "needs tokenizer="),
        ({"train_dataset": [{"question": "1+1="}]}, DataError, "no 'prompt' column"),
        ({"reward_funcs": [lambda prompts, completions, **kw: [0.0]]}, ConfigError, "without a name"),
        ({"reward_funcs": {"answer_format": exact_sum}}, Exception, "already a registered reward function"),
        ({"peft_config": object()}, ConfigError, "peft.LoraConfig"),
    ],
)
def test_wrong_objects_say_what_to_pass(kwargs, error, said):
    with pytest.raises(error, match=said):
        take_objects(TrainConfig(), **kwargs)
