"""Every pass sees the image: the training pass's policy log-probs of a VLM equal the HF engine's own
log-probs of the ids it sampled, for both families, prompts with 1-3 images, micro-batch boundaries in
random places, packing on and off; and a prompt's image features are computed once, not per sample."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.vision import FAMILIES, load_folder, policy_logprobs, random_records, vision_generator

from grpo_lightning.config import AlgorithmConfig
from grpo_lightning.step.module import GRPOModule

# float32 on a CPU: the engine's prefill-and-decode and the training pass's full forward differ by
# summation order only (measured below 1e-6); a wrong pixel, position or image token moves them by far more.
TOLERANCE = 1e-5
CASES = 3


@pytest.mark.parametrize("family", FAMILIES)
def test_training_pass_logprobs_are_the_engines_own(family, tiny_vlm_folders):
    policy, tokenizer = load_folder(tiny_vlm_folders[family], freeze_vision="false")  # gradients reach the tower
    rng = random.Random(f"vision-logprobs-{family}")
    for case in range(CASES):
        records = random_records(rng, rng.randint(1, 3))
        generator = vision_generator(
            policy,
            tokenizer,
            rng.randint(2, 3),
            max_new_tokens=rng.randint(2, 7),
            temperature=rng.choice([0.7, 1.0, 1.3]),
        )
        batch = generator.generate(records, step=case, rank=0)
        mask = batch.completion_mask.bool()
        for pack in (False, True):
            size = rng.randint(1, batch.num_sequences)
            logp, module = policy_logprobs(policy, batch, pack, size)
            diff = float((logp - batch.engine_logprobs)[mask].abs().max())
            where = f"case {case}: {len(records)} prompts, pack={pack}, micro-batches of {size}"
            assert diff <= TOLERANCE, f"{where}: |trainer - engine| = {diff:.2e}"
            if pack:
                assert module.forward_pass.vision.packing_verified, where


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompts_image_features_are_computed_once_per_pass(family, tiny_vlm_folders):
    """A group's G rows share their prompt's features; a frozen tower's serve every pass of the step."""
    rng = random.Random(f"vision-once-{family}")
    records = random_records(rng, 3)
    for frozen in (False, True):
        policy, tokenizer = load_folder(tiny_vlm_folders[family], freeze_vision=str(frozen).lower())
        batch = vision_generator(policy, tokenizer, 4, max_new_tokens=3).generate(records, step=0, rank=0)
        module = GRPOModule(policy, AlgorithmConfig(beta=0.04, micro_batch_size=4))  # whole groups
        prepared = module.prepare(batch)  # the reference pass
        cache = module.forward_pass.vision.cache
        assert cache.computed == (3 if frozen else 3)  # once per prompt, not per sample
        module.accumulate_gradients(batch, prepared)
        # Trained: the policy's tower is not the reference's, and its features carry a graph.
        assert cache.computed == (3 if frozen else 6)
        if frozen:  # the reference shares the frozen tower: no second copy of it
            tower = [p for n, p in policy.named_parameters() if not p.requires_grad]
            assert tower and all(any(p is q for q in module.reference.parameters()) for p in tower)


def test_a_sampled_image_token_in_a_completion_is_text(tiny_vlm_folders):
    """An image token the policy samples is an ordinary token in every pass (no feature, text position)."""
    policy, tokenizer = load_folder(tiny_vlm_folders["qwen2_vl"])
    batch = vision_generator(policy, tokenizer, 2, max_new_tokens=3).generate(
        random_records(random.Random(0), 1), step=0, rank=0
    )
    image = policy.config.image_token_id
    batch.completion_ids[:, 0] = image  # as if sampled
    logp, _ = policy_logprobs(policy, batch, pack=False, size=2)
    assert torch.isfinite(logp).all()
