"""``WeightSync``: keep the generation engine's weights equal to the policy's.

An engine with its own copy of the weights (vLLM) samples from a stale policy unless the
trainer pushes every update into it. The module asks its rollout generator to sync at the
start of training (so an engine started from another snapshot, or shared between runs,
begins from the policy the module trains) and after every optimizer step; every
``sync_every`` steps the policy's ``state_dict`` goes into the engine (in memory in process,
through a safetensors folder out of process; see :meth:`VLLMEngine.load_weights`). With
``verify=True`` the engine must then score a probe sequence like the policy does, or
:class:`WeightSyncError` stops the run: a sync that silently did nothing would train on
samples from the initial model forever.
"""

from __future__ import annotations

import time

import torch

from grpo_lightning.models.lora import engine_weights


class WeightSyncError(RuntimeError):
    """The engine's log-probs differ from the policy's after a weight sync."""


class WeightSync:
    def __init__(self, sync_every: int = 1, verify: bool = False, tolerance: float = 1e-3):
        if sync_every < 1:
            raise ValueError(f"sync_every={sync_every} must be >= 1")
        self.sync_every = sync_every
        self.verify = verify
        self.tolerance = tolerance
        self.synced_at_step = -1
        self.last_sync_seconds: float | None = None
        self.last_probe_diff: float | None = None
        self.num_syncs = 0

    def due(self, step: int) -> bool:
        """Whether ``sync_every`` optimizer steps have passed since the last sync."""
        return step - self.synced_at_step >= self.sync_every

    def sync(self, module, engine, step: int, probe=None, tokenizer=None) -> dict[str, float]:
        """Push ``module.policy``'s weights into ``engine`` now; returns ``rollout/sync_*`` metrics."""
        # A LoRA policy's merged weights (computed out of place, timed with the push), else its state dict.
        start = time.perf_counter()
        weights = engine_weights(module.policy)
        seconds = time.perf_counter() - start + engine.load_weights(weights, version=step)
        self.synced_at_step, self.last_sync_seconds = step, seconds
        self.num_syncs += 1
        metrics = {"rollout/sync_seconds": seconds}
        if self.verify:
            self.last_probe_diff = self.check(module, engine, probe, tokenizer)
            metrics["rollout/sync_probe_diff"] = self.last_probe_diff
        return metrics

    @staticmethod
    def probe_ids(probe, tokenizer) -> tuple[list[int], list[int]]:
        """Prompt and completion ids to score: the last rollout's first sample, or a fixed sequence."""
        if probe is not None:
            prompt = probe.prompt_ids[0][probe.prompt_mask[0].bool()].tolist()
            completion = probe.completion_ids[0][probe.completion_mask[0].bool()].tolist()
            if prompt and completion:
                return prompt, completion
        vocab = len(tokenizer) if tokenizer is not None else 16
        ids = [3 + (7 * i) % max(vocab - 3, 1) for i in range(12)]
        return ids[:4], ids[4:]

    @torch.no_grad()
    def check(self, module, engine, probe=None, tokenizer=None) -> float:
        """Max |engine - policy| log-prob over the probe (temperature 1); raises beyond tolerance."""
        prompt, completion = self.probe_ids(probe, tokenizer)
        engine_logp = torch.tensor(engine.sequence_logprobs(prompt, completion))
        ids = torch.tensor([prompt + completion], device=module.device)
        was_training = module.policy.training
        module.policy.eval()
        try:
            policy_logp = (
                module.completion_log_probs(module.policy, ids, torch.ones_like(ids), len(prompt), temperature=1.0)
                .logp[0]
                .float()
                .cpu()
            )
        finally:
            module.policy.train(was_training)
        diff = float((engine_logp - policy_logp).abs().max())
        if not diff <= self.tolerance:
            raise WeightSyncError(
                f"after the weight sync at step {self.synced_at_step} the engine's log-probs of a probe "
                f"sequence differ from the policy's by up to {diff:.3g} (tolerance "
                f"rollout.vllm.verify_tolerance={self.tolerance}): the engine is not sampling from the "
                f"policy being trained. Causes: weight names the engine does not map, a dtype "
                f"mismatch (rollout.vllm.dtype), or a sync that failed silently."
            )
        return diff
