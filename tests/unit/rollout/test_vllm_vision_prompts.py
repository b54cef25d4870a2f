"""The vLLM side of a vision-language policy without vLLM: each image's run of tokens collapsed to one
(vLLM expands it again), the weight names vLLM's loader takes, and a frozen tower pushed once."""

from __future__ import annotations

import random

import pytest
from helpers.vision import load_folder
from safetensors import safe_open

from grpo_lightning.rollout.engine import EngineError
from grpo_lightning.rollout.vllm_vision import collapsed, engine_names, write_engine_weights
from grpo_lightning.step.weight_push import policy_weights

IMAGE = 7


def test_collapsing_keeps_one_token_per_image_even_side_by_side():
    """Property: expanding the collapsed ids by the counts gives the ids back."""
    rng = random.Random(0)
    for _ in range(300):
        counts = [rng.randint(1, 6) for _ in range(rng.randint(1, 4))]
        ids = [rng.randint(20, 30) for _ in range(rng.randint(0, 3))]
        for count in counts:
            ids += [IMAGE] * count + [rng.randint(20, 30) for _ in range(rng.choice([0, 0, 1, 2]))]  # 0: side by side
        short = collapsed(ids, IMAGE, counts)
        assert short.count(IMAGE) == len(counts)
        expanded, index = [], 0
        for token in short:
            if token == IMAGE:
                expanded += [IMAGE] * counts[index]
                index += 1
            else:
                expanded.append(token)
        assert expanded == ids
    with pytest.raises(EngineError, match="more image tokens"):
        collapsed([IMAGE] * 5, IMAGE, [2, 2])


def test_llava_weights_take_the_hub_names_vllm_loads(tiny_vlm_folders, tmp_path):
    policy, _ = load_folder(tiny_vlm_folders["llava"])
    names = dict(engine_names(policy, policy.state_dict().items()))
    tower = [n for n in names if n.startswith("model.vision_tower.")]
    assert tower and all(n.startswith("model.vision_tower.vision_model.") for n in tower)
    assert "lm_head.weight" in names and any(n.startswith("model.language_model.") for n in names)
    write_engine_weights(policy, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(names)
    qwen, _ = load_folder(tiny_vlm_folders["qwen2_vl"])
    assert dict(engine_names(qwen, qwen.state_dict().items())).keys() == qwen.state_dict().keys()


def test_a_frozen_tower_is_pushed_with_the_first_sync_only(tiny_vlm_folders):
    policy, _ = load_folder(tiny_vlm_folders["llava"])  # a folder's tower: frozen
    frozen = {n for n, p in policy.named_parameters() if not p.requires_grad}
    first = dict(policy_weights(policy, 0).tensors)
    later = dict(policy_weights(policy, 1, whole=False).tensors)
    assert len(first) == len(policy.state_dict()) and frozen
    assert len(later) == len(first) - len(frozen)
    assert not any(n.replace(".vision_model.", ".") in frozen for n in later)
    trained, _ = load_folder(tiny_vlm_folders["llava"], freeze_vision="false")
    assert len(policy_weights(trained, 1, whole=False).tensors) == len(first)
