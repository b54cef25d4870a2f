"""Vision-language policies load from a saved folder as a user's folder does (both families, no
torchvision), freeze what ``model.freeze_vision`` says, put LoRA on the language model only, and
export with their processor."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.vision import FAMILIES, load_folder, random_records
from transformers import AutoProcessor

from grpo_lightning.config import ConfigError, ModelConfig, TrainConfig, validate_config
from grpo_lightning.config.model import LoraModelConfig, TinyVlmConfig
from grpo_lightning.data.vision_prompting import VisionPrompts
from grpo_lightning.models import load_policy
from grpo_lightning.models.loading import load_tokenizer
from grpo_lightning.models.memory import model_shape, step_bytes
from grpo_lightning.models.vision import family_of
from grpo_lightning.models.vision.compat import torchvision_installed
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.runtime.export import export_hf
from grpo_lightning.tasks.shape_drawn import ShapeDrawnTaskConfig


def vision_parameters(policy) -> list[tuple[str, torch.nn.Parameter]]:
    prefixes = family_of(policy).vision_prefixes
    return [(n, p) for n, p in policy.named_parameters() if n.startswith(prefixes)]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_folder_loads_with_its_processor_and_a_frozen_tower(family, tiny_vlm_folders):
    policy, tokenizer = load_folder(tiny_vlm_folders[family])
    assert type(policy).__name__.endswith("ForConditionalGeneration")
    assert processor_of(tokenizer) is not None and tokenizer.padding_side == "left"
    tower = vision_parameters(policy)
    assert tower and not any(p.requires_grad for _, p in tower)  # a pretrained tower: frozen by default
    assert all(p.requires_grad for n, p in policy.named_parameters() if (n, p) not in tower)
    unfrozen, _ = load_folder(tiny_vlm_folders[family], freeze_vision="false")
    assert all(p.requires_grad for p in unfrozen.parameters())


def test_the_in_code_tiny_vlm_trains_its_tower():
    """A frozen random tower cannot learn to see: auto trains the built-in one."""
    for family in FAMILIES:
        policy, _ = load_policy(ModelConfig(name_or_path="tiny_vlm", tiny_vlm=TinyVlmConfig(family=family)))
        assert all(p.requires_grad for p in policy.parameters())
        assert family_of(policy) is family_of(policy.config)


def test_torchvision_is_absent_here_and_the_processors_are_pil():
    """The project uninstalls torchvision (docs/vllm.md): what docs/vision.md says it costs is true here."""
    assert not torchvision_installed()
    policy, tokenizer = load_policy(ModelConfig(name_or_path="tiny_vlm", tiny_vlm=TinyVlmConfig(family="qwen2_vl")))
    processor = processor_of(tokenizer)
    assert "Pil" in type(processor.image_processor).__name__ and not hasattr(processor, "video_processor")


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapts_the_language_model_only(family, tiny_vlm_folders):
    pytest.importorskip("peft")
    policy, _ = load_folder(tiny_vlm_folders[family], lora=LoraModelConfig(rank=4))
    adapted = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert adapted and all("lora_" in n for n in adapted)
    prefixes = tuple(f"base_model.model.{p}" for p in family_of(policy.get_base_model()).vision_prefixes)
    assert not [n for n in adapted if n.startswith(prefixes)], "LoRA on the vision side"
    assert not [n for n in adapted if "lm_head" in n]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_export_holds_the_processor(family, tiny_vlm_folders, tmp_path):
    policy, tokenizer = load_folder(tiny_vlm_folders[family])
    folder = export_hf(policy, tokenizer, tmp_path / "hf")
    reloaded, reloaded_tokenizer = load_folder(str(folder))
    record = random_records(random.Random(1), 1, 2, 2)[0]
    ids, vision = VisionPrompts(processor_of(tokenizer))(record)
    ids_again, vision_again = VisionPrompts(AutoProcessor.from_pretrained(folder))(record)
    assert ids == ids_again and vision.key == vision_again.key
    for name, tensor in vision.tensors.items():
        assert torch.equal(tensor, vision_again.tensors[name]), name
    for (n, p), (m, q) in zip(policy.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert n == m and torch.equal(p, q), n


def test_the_tokenizer_and_context_load_without_the_weights(tiny_vlm_folders):
    tokenizer, context = load_tokenizer(ModelConfig(name_or_path=tiny_vlm_folders["qwen2_vl"]))
    assert processor_of(tokenizer) is not None and context == 256
    tiny, context = load_tokenizer(ModelConfig(name_or_path="tiny_vlm"))
    assert processor_of(tiny) is not None and context == 256


def test_the_memory_estimate_reads_a_vlms_text_and_vision_shapes(tiny_vlm_folders):
    for name in ("tiny_vlm", tiny_vlm_folders["llava"]):
        shape = model_shape(ModelConfig(name_or_path=name))
        assert shape.hidden == 64 and shape.layers == 2 and shape.vision_hidden == 64
        assert shape.patches_per_image == shape.tokens_per_image == 16  # 32 / 8 squared


def test_the_memory_estimate_grows_with_the_images_of_a_prompt():
    """Image tokens lengthen every sequence and the tower runs on every image: both are counted."""
    cfg = TrainConfig()
    cfg.model = ModelConfig(name_or_path="tiny_vlm")
    shape = model_shape(cfg.model)
    sizes = [sum(step_bytes(cfg, shape, images).values()) for images in range(4)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert "vision tower activations" in step_bytes(cfg, shape, 1) and "vision tower activations" not in step_bytes(
        cfg, shape, 0
    )


def test_the_memory_estimate_counts_an_environments_pictures():
    """task=shape_drawn's picture arrives in the environment's reply, not in the data: its image tokens and
    the tower's activations are counted all the same, the tower's once per episode (each episode's pictures
    are its own), and no more pictures than the runner lets an episode hold."""
    cfg = TrainConfig()
    cfg.model = ModelConfig(name_or_path="tiny_vlm")
    cfg.rollout.num_generations, cfg.algorithm.micro_batch_size = 4, 8
    shape = model_shape(cfg.model)
    data = step_bytes(cfg, shape, images_per_prompt=1)  # one image per prompt in the data
    cfg.task = ShapeDrawnTaskConfig()  # its rows carry no image; its environment returns one per episode
    parts = step_bytes(cfg, shape)
    assert parts["vision tower activations"] == 4 * data["vision tower activations"]  # 8 episodes, 2 prompts
    micro = "activations and logits of a 8-sequence micro-batch"
    assert parts[micro] == data[micro]  # one picture's image tokens in every sequence
    sizes = {}
    for images in (4, 9):
        cfg.task.images_per_episode = images
        sizes[images] = step_bytes(cfg, shape)
    assert sizes[4] == sizes[9] and sizes[4]["vision tower activations"] == 4 * parts["vision tower activations"]
    with pytest.raises(ConfigError, match=r"task.images_per_episode=9 is more than rollout.vllm.images_per_prompt=4"):
        validate_config(cfg)
