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


@pytest.mark.parametrize("family", FAMILIES)
def test_the_training_gradient_is_a_direct_hf_forwards(family, tiny_vlm_folders):
    """The policy-gradient step's gradient on every module (the tower and projector through the features a
    group's rows share, the text model, the head) equals the one of a plain HF forward per sequence with
    its own pixels: a detached or mis-routed feature would keep every log-prob and lose the tower's signal."""
    policy, tokenizer = load_folder(tiny_vlm_folders[family], freeze_vision="false")
    rng = random.Random(f"vision-grad-{family}")
    generator = vision_generator(policy, tokenizer, 4, max_new_tokens=3)
    image_token = policy.config.image_token_id
    batch = next(  # a sampled image token is text to us and an image slot to HF's forward: compare without one
        b
        for b in (generator.generate(random_records(rng, 3), step=s, rank=0) for s in range(20))
        if not (b.completion_ids == image_token).any()
    )
    batch.rewards = torch.tensor([rng.gauss(0, 1) for _ in range(batch.num_sequences)])
    module = GRPOModule(policy, AlgorithmConfig(beta=0.0, pack_sequences=False, micro_batch_size=4))
    module.accumulate_gradients(batch, module.prepare(batch))
    ours = {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}
    policy.zero_grad(set_to_none=True)
    groups = batch.rewards.view(-1, 4)
    advantages = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).view(-1)
    loss = 0.0
    for i in range(batch.num_sequences):  # seq_mean_token_mean at ratio 1: -A x mean log-prob, over sequences
        prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
        completion = batch.completion_ids[i][batch.completion_mask[i].bool()]
        ids = torch.cat([prompt, completion])[None]
        extra = dict(batch.vision[i].tensors)
        if family == "qwen2_vl":  # its M-RoPE reads which tokens are the image's (1) from the processor's types
            extra["mm_token_type_ids"] = (ids == image_token).long()
        logits = policy(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits[0]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), -1).gather(-1, completion[:, None])
        loss = loss - advantages[i] * logp.mean() / batch.num_sequences
    loss.backward()
    vision = [n for n in ours if "vision_tower" in n or "visual" in n or "projector" in n or "merger" in n]
    assert vision, "the tower trains: its gradient must be compared"
    for name, param in policy.named_parameters():
        want = param.grad if param.grad is not None else torch.zeros_like(param)
        got = ours.get(name, torch.zeros_like(param))
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (
            f"{family} {name}: |diff| {float((got - want).abs().max()):.2e}"
        )
