"""Fake rollout engines with weights of their own, honest or lying, for the F8 (mismatch) and staleness tests.

:class:`OwnWeightsEngine` keeps a copy of the policy, loads every sync and samples one request at a
time with the package's seeded sampler, reporting the log-prob of each sampled token after
temperature and truncation (what vLLM's ``processed_logprobs`` reports). Each fault is one switch:

* ``ignore_loads``: reports the new weight version while serving the old weights (a sync that
  silently failed; a LoRA adapter the engine says it loaded and never did);
* ``stale_prefix_cache``: a prompt seen before is prefilled with the weights of its first sight
  (a prefix cache not reset at the sync); decoding uses the current weights;
* ``force_top_p``: samples from the nucleus whatever the config says;
* ``raw_logprobs``: reports log-probs before the temperature;
* ``dtype=torch.bfloat16``: a bf16 engine (precision noise only: the clean control);
* ``version_delay``: applies (and reports) each sync only after that many generate calls (a slow engine).
"""

from __future__ import annotations

import copy
from dataclasses import replace

import torch
from transformers import DynamicCache

from grpo_lightning.records import Completion
from grpo_lightning.rollout.engine import EngineBase
from grpo_lightning.rollout.sampler import SeededSampler


class OwnWeightsEngine(EngineBase):
    owns_weights = True
    supports_async = True  # generate_async runs at submission: submission order, as vLLM's worker

    def __init__(
        self,
        policy,
        eos_token_id: int,
        *,
        dtype: torch.dtype = torch.float32,
        ignore_loads: bool = False,
        stale_prefix_cache: bool = False,
        force_top_p: float | None = None,
        raw_logprobs: bool = False,
        version_delay: int = 0,
    ):
        self.model = copy.deepcopy(policy).to(dtype).eval()
        self.eos, self.dtype = eos_token_id, dtype
        self.ignore_loads, self.stale_prefix_cache = ignore_loads, stale_prefix_cache
        self.force_top_p, self.raw_logprobs, self.version_delay = force_top_p, raw_logprobs, version_delay
        self.weight_version: int | None = 0  # built from the policy before any update
        self.queued: list[tuple[dict, int]] = []  # syncs not yet applied (version_delay)
        self.prefix_models: dict[tuple[int, ...], torch.nn.Module] = {}  # prompt -> the weights that prefilled it

    def load_weights(self, named_tensors, version=None) -> float:
        self.queued.append([{k: v.detach().clone() for k, v in named_tensors}, version, 0])
        self._apply_due()
        return 0.0

    def _apply_due(self) -> None:
        """Apply the syncs that waited ``version_delay`` generate calls (all of them without a delay)."""
        while self.queued and self.queued[0][2] >= self.version_delay:
            tensors, applied, _ = self.queued.pop(0)
            if not self.ignore_loads:
                self.model.load_state_dict({k: v.to(self.dtype) for k, v in tensors.items()}, strict=False)
            self.weight_version = applied

    @torch.no_grad()
    def generate(self, requests, sampling):
        for sync in self.queued:  # a slow engine: a sync is applied after version_delay generate calls
            sync[2] += 1
        self._apply_due()
        if self.force_top_p is not None:
            sampling = replace(sampling, top_p=self.force_top_p)
        return [self._one(r, sampling) for r in requests]

    def _one(self, request, sampling) -> Completion:
        prompt = torch.tensor([request.prompt_ids])
        key = tuple(request.prompt_ids)
        prefill_model = self.model
        if self.stale_prefix_cache:
            prefill_model = self.prefix_models.setdefault(key, copy.deepcopy(self.model))
        cache = DynamicCache()
        logits = prefill_model(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1].float()
        sampler = SeededSampler([request.seed], sampling)
        tokens, logprobs = [], []
        for _ in range(sampling.max_new_tokens):
            token, logp = sampler.draw(logits)
            if self.raw_logprobs:
                logp = torch.log_softmax(logits, dim=-1).gather(-1, token[:, None])[:, 0]
            tokens.append(int(token))
            logprobs.append(float(logp))
            if tokens[-1] == self.eos or len(tokens) == sampling.max_new_tokens:
                break
            out = self.model(input_ids=token[:, None], past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1].float()
        finished = tokens[-1] == self.eos
        return Completion(token_ids=tokens, finished=finished, logprobs=logprobs, weight_version=self.weight_version)

    @torch.no_grad()
    def sequence_logprobs(self, prompt_ids, completion_ids):
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
        logp = torch.log_softmax(self.model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        picked = logp.gather(-1, ids[0, 1:, None])[:, 0]
        return picked[len(prompt_ids) - 1 :].tolist()
