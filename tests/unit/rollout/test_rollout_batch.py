"""RolloutBatch padding: left-padded prompts and right-padded completions, each row where it belongs."""

from __future__ import annotations

import random

import torch

from grpo_lightning.rollout import Completion, RolloutBatch


def test_padding_puts_every_token_and_log_prob_in_its_place():
    rng = random.Random(0)
    for _ in range(50):
        pad = rng.randrange(5)
        prompts = [[rng.randrange(100) for _ in range(rng.randint(0, 7))] for _ in range(rng.randint(1, 9))]
        if not any(prompts):
            prompts[0] = [1]
        ids, mask = RolloutBatch.pad_prompts(prompts, pad)
        width = max(len(p) for p in prompts)
        assert ids.shape == mask.shape == (len(prompts), width)
        for row, prompt in enumerate(prompts):
            assert ids[row, width - len(prompt) :].tolist() == prompt and mask[row].sum() == len(prompt)
            assert ids[row, : width - len(prompt)].eq(pad).all() and not mask[row, : width - len(prompt)].any()
        with_logprobs = rng.random() < 0.5
        completions = []
        for _ in range(rng.randint(1, 9)):
            tokens = [rng.randrange(100) for _ in range(rng.randint(0, 6))]
            logprobs = [-rng.random() for _ in tokens] if with_logprobs else None
            completions.append(Completion(token_ids=tokens, finished=rng.random() < 0.5, logprobs=logprobs))
        ids, mask, finished, logprobs = RolloutBatch.pad_completions(completions, pad)
        width = max(1, max(len(c.token_ids) for c in completions))
        assert ids.shape == mask.shape == (len(completions), width)
        assert finished.tolist() == [c.finished for c in completions]
        assert (logprobs is not None) == with_logprobs
        for row, c in enumerate(completions):
            n = len(c.token_ids)
            assert ids[row, :n].tolist() == c.token_ids and ids[row, n:].eq(pad).all()
            assert mask[row, :n].all() and not mask[row, n:].any()
            if with_logprobs:
                assert torch.equal(logprobs[row, :n], torch.tensor(c.logprobs, dtype=torch.float32))
                assert not logprobs[row, n:].any()
