"""``WeightSyncCallback``: keep the generation engine's weights equal to the policy's.

An engine with its own copy of the weights (vLLM) samples from a stale policy unless the
trainer pushes every update into it. After every ``sync_every`` optimizer steps this callback
pushes ``policy.state_dict()`` into the engine (in memory in process, through a safetensors
folder out of process; see :meth:`VLLMEngine.load_weights`), logs ``rollout/sync_seconds``,
and with ``verify=True`` checks that the engine now scores a probe sequence like the policy
does, raising :class:`WeightSyncError` otherwise: a sync that silently did nothing would
train on samples from the initial model forever.

It also syncs once at the start of training, so an engine started from another snapshot (or
shared between runs) always begins from the policy the module trains.
"""

from __future__ import annotations

import lightning as L
import torch

from grpo_lightning.callbacks.rollout import RolloutCallback


class WeightSyncError(RuntimeError):
    """The engine's log-probs differ from the policy's after a weight sync."""


class WeightSyncCallback(L.Callback):
    def __init__(
        self,
        rollout: RolloutCallback,
        sync_every: int = 1,
        verify: bool = False,
        tolerance: float = 1e-3,
    ):
        if sync_every < 1:
            raise ValueError(f"sync_every={sync_every} must be >= 1")
        self.rollout = rollout
        self.sync_every = sync_every
        self.verify = verify
        self.tolerance = tolerance
        self.synced_at_step = -1
        self.last_sync_seconds: float | None = None
        self.last_probe_diff: float | None = None
        self.num_syncs = 0

    @property
    def engine(self):
        if self.rollout.engine is None or not hasattr(self.rollout.engine, "load_weights"):
            raise TypeError("WeightSyncCallback needs an engine with load_weights (VLLMEngine)")
        return self.rollout.engine

    def sync(self, pl_module: L.LightningModule, step: int) -> float:
        """Push the policy's weights into the engine now; returns the seconds the reload took."""
        seconds = self.engine.load_weights(pl_module.policy.state_dict().items())
        self.synced_at_step, self.last_sync_seconds = step, seconds
        self.num_syncs += 1
        if self.verify:
            self.last_probe_diff = self.check(pl_module)
        return seconds

    def probe(self) -> tuple[list[int], list[int]]:
        """Prompt and completion ids to score: the last rollout's first sample, or a fixed sequence."""
        batch = self.rollout.last_rollout
        if batch is not None:
            prompt = batch.prompt_ids[0][batch.prompt_mask[0].bool()].tolist()
            completion = batch.completion_ids[0][batch.completion_mask[0].bool()].tolist()
            if prompt and completion:
                return prompt, completion
        vocab = len(self.rollout.tokenizer)
        ids = [3 + (7 * i) % max(vocab - 3, 1) for i in range(12)]
        return ids[:4], ids[4:]

    @torch.no_grad()
    def check(self, pl_module: L.LightningModule) -> float:
        """Max |engine - policy| log-prob over the probe (temperature 1); raises beyond tolerance."""
        prompt, completion = self.probe()
        engine_logp = torch.tensor(self.engine.sequence_logprobs(prompt, completion))
        ids = torch.tensor([prompt + completion], device=pl_module.device)
        was_training = pl_module.policy.training
        pl_module.policy.eval()
        try:
            policy_logp = pl_module.completion_log_probs(
                pl_module.policy, ids, torch.ones_like(ids), len(prompt), temperature=1.0
            ).logp[0].float().cpu()
        finally:
            pl_module.policy.train(was_training)
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

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.sync(pl_module, trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step - self.synced_at_step < self.sync_every:
            return
        seconds = self.sync(pl_module, trainer.global_step)
        metrics = {"rollout/sync_seconds": seconds}
        if self.last_probe_diff is not None:
            metrics["rollout/sync_probe_diff"] = self.last_probe_diff
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)
