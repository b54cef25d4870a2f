"""The reward_model source: a local sequence-classification model scores prompt + completion."""

from __future__ import annotations

import pytest
import torch

from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards import REWARD_FUNCTIONS, RewardScorer
from grpo_lightning.rewards.sources.base import SourceReward
from grpo_lightning.rewards.sources.reward_model import RewardModelOptions, RewardModelReward
from tests.helpers.tiny_reward_model import save_tiny_reward_model

TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }} {% endfor %}"


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm"))


def test_scores_the_last_token_batched_and_unbatched_alike(rm_folder):
    reward = RewardModelReward(RewardModelOptions(path=str(rm_folder), batch_size=2))
    prompts = ["1+2=", "3+4=", "5+5=", "9+9="]
    completions = ["7", "12", "3 7", "8"]
    scores = reward(prompts=prompts, completions=completions)
    assert scores[0] == pytest.approx(1.0, abs=1e-4) and scores[2] == pytest.approx(1.0, abs=1e-4)
    assert max(scores[1], scores[3]) < 0.9
    one_batch = RewardModelReward(RewardModelOptions(path=str(rm_folder), batch_size=16))
    assert one_batch(prompts=prompts, completions=completions) == pytest.approx(scores, abs=1e-5)
    assert not any(p.requires_grad for p in reward.model.parameters()) and not reward.model.training


def test_dtype_and_messages(rm_folder):
    reward = RewardModelReward(RewardModelOptions(path=str(rm_folder), dtype="bfloat16"))
    assert reward.model.dtype == torch.bfloat16
    chat = [[{"role": "assistant", "content": "7"}], [{"role": "assistant", "content": "8"}]]
    prompts = [[{"role": "user", "content": "1+6="}]] * 2
    good, bad = reward(prompts=prompts, completions=chat)
    assert good == pytest.approx(1.0, abs=0.02) and bad < good


def test_chat_template_applied_when_the_tokenizer_has_one(tmp_path):
    folder = save_tiny_reward_model(tmp_path, chat_template=TEMPLATE)
    reward = RewardModelReward(RewardModelOptions(path=str(folder)))
    assert reward.text("1+2=", "3") == "u:1+2= a:3 "
    plain = RewardModelReward(RewardModelOptions(path=str(folder), chat_template=False))
    assert plain.text("1+2=", "3") == "1+2=3"


def test_a_folder_without_a_model_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="rewards.reward_model.path"):
        RewardModelReward(RewardModelOptions(path=str(tmp_path)))
    assert any("no config.json" in p for p in RewardModelOptions(path=str(tmp_path)).validate("rewards.reward_model."))


def test_truncated_texts_are_counted(rm_folder):
    logged = []
    reward = RewardModelReward(RewardModelOptions(path=str(rm_folder), max_length=8))
    scores = reward(
        prompts=["1+2=", "a long question: 1+2+3+4="], completions=["3", "10"], log_metric=lambda *a: logged.append(a)
    )
    assert logged == [("reward_model/truncated", 1.0)] and len(scores) == 2


def test_registered_source_combines_with_functions_by_weight(rm_folder):
    entry = REWARD_FUNCTIONS["reward_model"]
    assert isinstance(entry, SourceReward)
    entry.bind(RewardModelOptions(path=str(rm_folder)))
    try:
        scorer = RewardScorer.from_names({"reward_model": 2.0, "arithmetic_exact": 1.0})
        total, parts = scorer(["3+4=", "3+4="], ["7", "8"], {"answer": ["7", "7"]})
        assert parts["reward_model"][0] == pytest.approx(1.0, abs=1e-4)
        assert total[0] == pytest.approx(3.0, abs=1e-3) and total[1] < 2.0
    finally:
        entry.bind(RewardModelOptions())
