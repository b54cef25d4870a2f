"""``WeightSync``: keep the generation engine's weights equal to the policy's.

An engine with its own copy of the weights (vLLM) samples from a stale policy unless the
trainer pushes every update into it. The module asks for a sync at the start of training (so
an engine started from another snapshot, or shared between runs, begins from the policy the
module trains) and after every optimizer step; every ``sync_every`` steps the policy's
tensors go into the engine (in memory in process, through a safetensors folder out of
process; see :meth:`VLLMEngine.load_weights`). The sync is handed what to push, a
:class:`~grpo_lightning.records.PolicyWeights` (named tensors and their version), and never
sees the module (:mod:`grpo_lightning.step.weight_push` gathers them). With ``verify=True`` the
engine must then score a fixed canary sequence as the policy did (:class:`ProbeScores`, scored
by the trainer before the push), or :class:`WeightSyncError` stops the run: a sync that
silently did nothing would train on samples from the initial model forever.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_lightning.records import PolicyWeights


class WeightSyncError(RuntimeError):
    """The engine's log-probs differ from the policy's after a weight sync."""


@dataclass(frozen=True)
class ProbeScores:
    """A probe sequence and the policy's log-prob of each of its completion tokens (temperature 1)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    policy_logprobs: torch.Tensor  # [len(completion_ids)] float32 on the CPU


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

    def sync(self, weights: PolicyWeights, engine, expected: ProbeScores | None = None) -> dict[str, float]:
        """Push ``weights`` into ``engine`` now; returns ``rollout/sync_*`` metrics. With ``verify``,
        ``expected`` (the policy's scores of the canary) must be given, and the engine must match
        them; an engine that ``verifies_before_commit`` runs that check before it reports the new
        version, so a wrong sync never shows as done."""
        if self.verify and expected is None:
            raise ValueError("WeightSync(verify=True).sync needs the policy's canary scores (expected=...)")
        diffs: list[float] = []

        def check(target=None) -> None:  # target: one server of several (vllm_server_pool.py); else engine
            diffs.append(self.check(engine if target is None else target, expected, weights.version))

        # The gathering (a LoRA policy's merge) and the engine's own time to load.
        extra = {"adapter_config": weights.adapter_config} if weights.adapter_config is not None else {}
        if self.verify and getattr(engine, "verifies_before_commit", False):
            extra["check"] = check
        seconds = weights.seconds + engine.load_weights(weights.tensors, version=weights.version, **extra)
        if self.verify and "check" not in extra:
            check()
        self.synced_at_step, self.last_sync_seconds = weights.version, seconds
        self.num_syncs += 1
        metrics = {"rollout/sync_seconds": seconds}
        if diffs:
            self.last_probe_diff = max(diffs)
            metrics["rollout/sync_probe_diff"] = self.last_probe_diff
        bytes_sent = getattr(getattr(engine, "transport", None), "last_bytes", None)
        if bytes_sent:
            metrics["rollout/sync_bytes"] = float(bytes_sent)
        return metrics

    @staticmethod
    def probe_ids(tokenizer=None) -> tuple[list[int], list[int]]:
        """The canary: a fixed prompt and completion (the same every sync, whatever the batch held)."""
        vocab = len(tokenizer) if tokenizer is not None else 16
        ids = [3 + (7 * i) % max(vocab - 3, 1) for i in range(12)]
        return ids[:4], ids[4:]

    def check(self, engine, expected: ProbeScores, version: int | None = None) -> float:
        """Max |engine - policy| log-prob over the canary (temperature 1); raises beyond tolerance."""
        engine_logp = torch.tensor(engine.sequence_logprobs(expected.prompt_ids, expected.completion_ids))
        policy_logp = expected.policy_logprobs
        diff = float((engine_logp - policy_logp).abs().max())
        if not diff <= self.tolerance:
            raise WeightSyncError(
                f"after the weight sync at step {self.synced_at_step if version is None else version} the engine's "
                f"log-probs of the canary "
                f"sequence differ from the policy's by up to {diff:.3g} (tolerance "
                f"rollout.vllm.verify_tolerance={self.tolerance}): the engine is not sampling from the "
                f"policy being trained. Causes: weight names the engine does not map, a dtype "
                f"mismatch (rollout.vllm.dtype), or a sync that failed silently."
            )
        return diff
