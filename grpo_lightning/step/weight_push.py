"""The module's side of its rollout engine: the weight sync and the engine's release.

For a sync, gather the policy's tensors (and, to verify, score the canary with the policy),
then hand both to the rollout generator's :class:`WeightSync`; the sync sees only those
records, and nothing flows back into the module but metrics.
"""

from __future__ import annotations

import time

import lightning as L
import torch

from grpo_lightning.models.adapter_sync import adapter_weights
from grpo_lightning.models.lora import engine_weights
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rollout.generator import RolloutGenerator
from grpo_lightning.rollout.vllm_vision import engine_names, frozen_vision_names
from grpo_lightning.rollout.weight_sync import ProbeScores, WeightSync


def policy_weights(policy: torch.nn.Module, version: int, adapter: bool = False, whole: bool = True) -> PolicyWeights:
    """The tensors an engine loads: a LoRA policy's merged weights (out of place, timed), else its state
    dict, under the engine's names (a VLM's, :mod:`grpo_lightning.rollout.vllm_vision`); with ``adapter``,
    only the LoRA adapter's tensors and config (adapter-only sync). Not ``whole``: without a VLM's frozen
    vision side, which the engine got with the first push and which never changes."""
    start = time.perf_counter()
    if adapter:
        tensors, config = adapter_weights(policy)
        return PolicyWeights(tensors, version, time.perf_counter() - start, adapter_config=config)
    skipped = set() if whole else frozen_vision_names(policy)
    named = engine_weights(policy) if not skipped else ((n, t) for n, t in engine_weights(policy) if n not in skipped)
    tensors = list(engine_names(policy, named))
    return PolicyWeights(tensors, version, time.perf_counter() - start)


@torch.no_grad()
def probe_scores(module, tokenizer=None) -> ProbeScores:
    """The policy's log-probs (temperature 1, eval mode) of the canary the engine must match."""
    prompt, completion = WeightSync.probe_ids(tokenizer)
    ids = torch.tensor([prompt + completion], device=module.device)
    was_training = module.policy.training
    module.policy.eval()
    try:
        logp = module.completion_log_probs(module.policy, ids, torch.ones_like(ids), len(prompt), temperature=1.0)
    finally:
        module.policy.train(was_training)
    return ProbeScores(prompt, completion, logp.logp[0].float().cpu())


def push_weights(module, step: int, force: bool = False) -> dict[str, float]:
    """Sync the engine of ``module.rollout`` if it owns weights and a sync is due (or ``force``);
    returns the metrics to log (empty when nothing ran)."""
    generator = module.rollout
    sync = generator.weight_sync if generator is not None else None
    if sync is None or not (force or sync.due(step)):
        return {}
    adapter = getattr(generator.engine, "takes_adapters", False)
    weights = policy_weights(module.policy, step, adapter=adapter, whole=force or sync.num_syncs == 0)
    expected = probe_scores(module, generator.tokenizer) if sync.verify else None
    return generator.sync_weights(weights, expected, rank=module.global_rank)


class CloseRolloutOnException(L.Callback):
    """Lightning tells only callbacks about exceptions: drain the generator's queued work and
    release an engine it built (a launched vLLM server) then."""

    def __init__(self, rollout: RolloutGenerator):
        self.rollout = rollout

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.rollout.shutdown()
