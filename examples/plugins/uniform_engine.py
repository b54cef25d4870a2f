"""A rollout engine of your own: how completions are sampled, in one file.

    grpo-lightning plugins=[examples/plugins/uniform_engine.py] rollout.engine=uniform_tokens


A baseline that ignores the policy: each completion is tokens drawn uniformly from the
vocabulary. It keeps the one rule every engine must keep (F1, F2): request i is sampled from a
random stream seeded by ``request.seed`` alone, so samples are reproducible and never share a
stream. An engine that samples from the policy itself subclasses ``EngineBase`` and writes
``generate``; one with weights of its own (vLLM) also sets ``owns_weights = True`` and
implements ``load_weights`` and ``sequence_logprobs``.
"""

import torch

from grpo_lightning.records import Completion
from grpo_lightning.rollout.engine import ENGINES, EngineBase


class UniformTokensEngine(EngineBase):
    def __init__(self, vocab_size: int, eos_token_id: int):
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def generate(self, requests, sampling):
        completions = []
        for request in requests:
            stream = torch.Generator().manual_seed(request.seed)
            ids = torch.randint(self.vocab_size, (sampling.max_new_tokens,), generator=stream).tolist()
            end = ids.index(self.eos_token_id) + 1 if self.eos_token_id in ids else len(ids)
            completions.append(Completion(token_ids=ids[:end], finished=end < len(ids) or ids[-1] == self.eos_token_id))
        return completions


@ENGINES.register("uniform_tokens")
def uniform_tokens(policy, tokenizer, cfg):
    return UniformTokensEngine(len(tokenizer), tokenizer.eos_token_id)
