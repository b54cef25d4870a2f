"""Environments with images: random episodes whose pictures arrive at random turns (the first observation,
any environment reply), both VLM families. The training pass's policy log-probs of the sampled ids equal the
HF engine's own, the loss mask is 0 on every environment and image token, and an image token that is not a
picture's (sampled by the model, or written by the environment as text) is text in every pass: before the
fix, the next turn's request took it for an image slot and the engine raised."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from helpers.vision import FAMILIES, load_folder, policy_logprobs, random_image, vision_generator

from grpo_lightning.config import RolloutConfig
from grpo_lightning.environments.base import Reset, Step
from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.images import EpisodeImages, refuse_engine
from grpo_lightning.environments.limits import EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.environments.returns import EnvironmentReturnError
from grpo_lightning.environments.rollout import EpisodeRollout
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.models.vision.tiny import IMAGE, build_tiny_processor, build_vision_tokenizer
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout.engine import Sampling
from tests.helpers.episodes import FakeEngine, chatml_tokenizer

TOLERANCE = 1e-5  # float32 on a CPU, as tests/unit/models/test_vision_logprobs.py (summation order only)
CASES = 2


class PictureEnv:
    """Random turns: each message holds 0-2 random pictures, or (text only) sometimes the image token as text."""

    def __init__(self, turns: int, picture_rate: float, pictures=None):
        self.turns, self.rate, self.pictures = turns, picture_rate, pictures

    def _message(self, rng: random.Random) -> dict:
        count = rng.choice([0, 1, 1, 2]) if rng.random() < self.rate else 0
        text = "".join(rng.choice("abc ?") for _ in range(rng.randint(1, 4)))
        if not count:
            return {"role": "user", "content": text + (IMAGE if rng.random() < 0.5 else "")}
        parts = [{"type": "image", "image": self.pictures(rng)} for _ in range(count)]
        return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}

    def reset(self, seed, row):
        self.rng, self.done = random.Random(seed), 0  # a group's episodes see the same pictures
        return Reset(messages=[self._message(self.rng)])

    def step(self, turn):
        self.done += 1
        return Step([self._message(self.rng)], reward=float(len(turn.text)), done=self.done >= self.turns)

    def close(self):
        pass


@pytest.mark.parametrize("family", FAMILIES)
def test_episode_pictures_reach_every_pass_at_the_engines_places(family, tiny_vlm_folders):
    policy, tokenizer = load_folder(tiny_vlm_folders[family], freeze_vision="false")  # gradients reach the tower
    image_token = policy.config.image_token_id
    rng = random.Random(f"episode-images-{family}")
    seen = {"reply pictures": 0, "non-slot image tokens in a request": 0}
    for case in range(CASES):
        turns = rng.randint(2, 3)
        generator = vision_generator(
            policy, tokenizer, 2, max_new_tokens=rng.randint(2, 5), temperature=rng.choice([0.7, 1.0, 1.3])
        )
        generator.scorer = RewardScorer.from_names({"environment": 1.0})
        limits = EpisodeLimits(max_turns=turns, max_turn_tokens=generator.sampling.max_new_tokens, context=256)
        generator.episodes = EpisodeRollout(
            lambda row, t=turns: PictureEnv(t, 0.7, random_image),
            limits,
            ChatRenderer(tokenizer),
            images=EpisodeImages(processor_of(tokenizer), max_images=16),
        )
        batch = generator.generate([{"prompt": "a"}, {"prompt": "b"}], step=case, rank=0)
        sampled = batch.completion_mask.bool() & batch.loss_mask.bool()
        for pack in (False, True):
            size = rng.randint(1, batch.num_sequences)
            logp, _ = policy_logprobs(policy, batch, pack, size)
            diff = float((logp - batch.engine_logprobs)[sampled].abs().max())
            assert diff <= TOLERANCE, (
                f"case {case}, pack={pack}, micro-batches of {size}: |trainer - engine| = {diff:.2e}"
            )
        for row, episode in enumerate(generator.episodes.last_episodes):
            sequence = episode.prompt_ids + episode.ids
            slots = set(batch.vision[row].slots) if batch.vision[row] is not None else set()
            assert all(sequence[s] == image_token for s in slots)
            in_prompt = [s for s in slots if s < len(episode.prompt_ids)]
            # A first observation's pictures are part of the prompt's identity (health fingerprints, tables).
            assert ("<image:" in batch.prompts[row]) == bool(in_prompt)
            for s in slots:  # every image token of a picture has loss mask 0 (an environment token)
                if s >= len(episode.prompt_ids):
                    assert batch.loss_mask[row, s - len(episode.prompt_ids)] == 0
                    seen["reply pictures"] += 1
            assert batch.loss_mask[row, : len(episode.ids)].tolist() == episode.loss_mask  # 0 on environment ids
            # An image token that is text, in the prompt or an environment reply: a later turn's request holds it.
            mask = [1] * len(episode.prompt_ids) + [1 - m for m in episode.loss_mask]
            loose = [s for s, t in enumerate(sequence) if t == image_token and s not in slots and mask[s]]
            seen["non-slot image tokens in a request"] += len(loose)
    assert all(seen.values()), f"the random cases missed a kind: {seen}"


TEXT = chatml_tokenizer()
SAMPLING = Sampling(max_new_tokens=3, temperature=1.0, top_p=1.0, top_k=0)


def play_one(env, images=None):
    engine = FakeEngine(len(TEXT), TEXT.eos_token_id, eos_rate=0.0)
    limits = EpisodeLimits(3, 3, context=500)
    runner = EpisodeRunner(
        engine,
        ChatRenderer(TEXT),
        lambda row: env,
        limits,
        SAMPLING,
        batch_window_s=0.001,
        env_name="pics",
        images=images,
    )
    return runner.run([{"prompt": "p"}], [0], [0])


@pytest.mark.parametrize(
    ("picture", "images", "says"),
    [
        ("a picture", None, "environment 'pics': step() of turn 1 returned 1 image(s) but the policy is a text-only"),
        (b"not an image", "vlm", "environment 'pics': step() of turn 1: image 0 (12 bytes) is not a picture Pillow"),
        ("many", "vlm", "environment 'pics': step() of turn 1 brings its episode to 3 images, more than "),
    ],
)
def test_a_picture_the_policy_cannot_take_ends_the_run_in_one_line(picture, images, says):
    if images == "vlm":
        images = EpisodeImages(build_tiny_processor(build_vision_tokenizer(), "llava", 32, 8), max_images=2)
    count = 3 if picture == "many" else 1
    ref = random_image(random.Random(0)) if picture == "many" else picture

    class Env(PictureEnv):
        def reset(self, seed, row):
            return Reset(messages=[{"role": "user", "content": "p"}])

        def step(self, turn):
            parts = [{"type": "image", "image": ref}] * count
            return Step([{"role": "user", "content": [*parts, {"type": "text", "text": "?"}]}])

    with pytest.raises(EnvironmentReturnError) as raised:
        play_one(Env(2, 0.0), images)
    assert str(raised.value).startswith(says) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("rollout", "says"),
    [
        (RolloutConfig(engine="vllm"), "rollout.engine=vllm: episodes of a vision-language policy (llava) run on"),
        (SimpleNamespace(engine="hf", mode="pipeline"), "rollout.mode=pipeline: episodes of a vision-language"),
    ],
)
def test_engines_that_take_no_episode_pictures_are_refused_for_a_vlm(rollout, says):
    with pytest.raises(ConfigError) as raised:
        refuse_engine("llava", rollout)
    assert str(raised.value).startswith(says) and "\n" not in str(raised.value)
    refuse_engine(None, rollout)  # a text policy's episodes run there as before
