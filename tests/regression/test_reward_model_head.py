"""Issue 46, silent failure 4: rewards.reward_model.path=<a causal-LM folder> loaded as a sequence
classifier with a newly initialised ``score`` head and returned random rewards without an error.
Now every weight the classifier lacks is an error naming the folder and the weights."""

from __future__ import annotations

import pytest

from grpo_lightning.errors import ConfigError
from grpo_lightning.rewards.sources.reward_model import RewardModelOptions, RewardModelReward
from tests.helpers.tiny_reward_model import save_tiny_causal_lm


def test_a_folder_without_a_reward_head_is_refused_naming_it_and_the_weights(tmp_path):
    folder = save_tiny_causal_lm(tmp_path / "causal_lm")
    with pytest.raises(ConfigError) as refused:
        RewardModelReward(RewardModelOptions(path=str(folder)))
    said = str(refused.value)
    assert str(folder) in said and "['score.weight']" in said and "random" in said and len(said.splitlines()) == 1
