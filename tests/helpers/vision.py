"""Tiny vision-language policies of both families and random prompts with images, for the tests.

The session fixtures in tests/conftest.py save one tiny VLM of each family to a folder; tests
load them through :func:`grpo_lightning.models.loading.load_policy`, the path a user's folder takes.
"""

from __future__ import annotations

import random
import string
from dataclasses import replace

from PIL import Image, ImageDraw

from grpo_lightning.config import AlgorithmConfig, ModelConfig, RolloutConfig
from grpo_lightning.data.vision_prompting import VisionPrompts
from grpo_lightning.models import load_policy
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.models.vision.tiny import build_tiny_vlm, build_vision_tokenizer
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import HFEngine, RolloutGenerator, Sampling
from grpo_lightning.step.micro_batches import micro_batches
from grpo_lightning.step.module import GRPOModule

FAMILIES = ("llava", "qwen2_vl")


def save_tiny_vlm(family: str, folder: str, seed: int = 0) -> str:
    """A tiny random VLM of ``family`` and its processor, saved as a Hugging Face folder."""
    model, processor = build_tiny_vlm(build_vision_tokenizer(family), family, seed=seed)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def load_folder(folder: str, **model_fields):
    """``(policy, tokenizer)`` of a saved VLM folder, loaded as a run loads it."""
    return load_policy(ModelConfig(name_or_path=folder, **model_fields))


def random_image(rng: random.Random) -> Image.Image:
    """A small picture of random size and colours (a few random rectangles)."""
    image = Image.new("RGB", (rng.randint(12, 60), rng.randint(12, 60)), tuple(rng.randrange(256) for _ in range(3)))
    pen = ImageDraw.Draw(image)
    for _ in range(rng.randint(0, 3)):
        x, y = rng.randrange(image.width), rng.randrange(image.height)
        pen.rectangle(
            (x, y, x + rng.randint(1, 9), y + rng.randint(1, 9)), fill=tuple(rng.randrange(256) for _ in range(3))
        )
    return image


def random_records(rng: random.Random, count: int, min_images: int = 1, max_images: int = 3) -> list[dict]:
    """Chat prompts of random text with ``min_images``..``max_images`` random pictures each; the image parts
    placed by TRL's rule (none given) or given explicitly, at random."""
    records = []
    for _ in range(count):
        images = [random_image(rng) for _ in range(rng.randint(min_images, max_images))]
        text = "".join(rng.choice(string.ascii_lowercase + " ?") for _ in range(rng.randint(1, 12)))
        if images and rng.random() < 0.5:  # explicit parts, text between the images
            content = []
            for image_index in range(len(images)):
                content += [{"type": "image"}, {"type": "text", "text": f"{text[: image_index + 1]} "}]
            prompt = [{"role": "user", "content": content}]
        else:
            prompt = [{"role": "user", "content": text}]
        records.append({"prompt": prompt, "images": images, "answer": "1"})
    return records


def vision_generator(policy, tokenizer, num_generations: int, engine=None, **sampling) -> RolloutGenerator:
    """A RolloutGenerator with a VLM's prompts over ``engine`` (default: the HF engine on ``policy``)."""
    if engine is None:
        engine = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id)
    generator = RolloutGenerator(
        engine=engine,
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names({"shapes_short": 1.0}),
        num_generations=num_generations,
        sampling=Sampling.from_config(RolloutConfig(**sampling)),
    )
    generator.vision = VisionPrompts(processor_of(tokenizer))
    return generator


def policy_logprobs(policy, batch, pack: bool, size: int):
    """The gradient pass's policy log-probs (recorded as the old policy's) over micro-batches of ``size``."""
    module = GRPOModule(policy, AlgorithmConfig(beta=0.0, pack_sequences=pack))
    prepared = replace(module.prepare(batch), micro_batches=list(micro_batches(batch, size)))
    stats = module.accumulate_gradients(batch, prepared, record_old=True)
    policy.zero_grad(set_to_none=True)
    return stats.old_logprobs.logp, module
