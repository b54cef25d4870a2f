"""F8: the rollout engine's log-probs disagree with the trainer's, and why.

Reads the step's mismatch totals (``algorithm/mismatch.py``: the engine's log-probs of the sampled
tokens against the trainer's first forward pass, before the update) and alerts at the anchors'
levels (verl's rollout-correction docs: mean IS weight outside [0.5, 2], ESS < 0.3, |k1| > 0.1,
chi2 > 1; slime fails a run above a mean |delta logp| of 0.1), or on a jump of the lag-0 gap
right after a weight sync. It then names the likely cause from the signature of the gap
(``d = log pi_train - log pi_engine`` per token):

* ``truncated_support``: nearly every token has d < 0 (the engine sampled from a top-p / top-k
  distribution, more confident than the full softmax the trainer scores);
* ``temperature``: d grows with the engine's log-prob at the slope ``1/T - 1`` (the engine's log-probs
  are before the temperature T, the trainer's after it);
* ``prefix_cache``: the gap sits on prompts seen before the sync, prompts new to the engine are clean;
* ``stale_weights``: a gap on every prompt, of both signs, at lag 0 (the engine says it holds the
  trainer's version but serves other weights: a sync or a LoRA adapter that never arrived);
* ``staleness``: only the lagged samples (async) are off, the lag-0 ones are fine (in pipeline mode
  lagged tokens are the ``pipeline_lag`` check's);
* ``precision``: a small per-token gap that only sequence-level statistics flag (long sequences).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lightning.algorithm.mismatch import GROUPS
from grpo_lightning.config.base import check, option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import CheckConfig, HealthCheck, register_check
from grpo_lightning.health.view import StepView

SUM_KEYS = ("tokens", "k1", "k3", "abs_dlogp", "w", "w2", "neg", "pos", "eng", "eng2", "d_eng")
SEEN_STEPS = 32  # steps of prompts remembered (plain data in the checkpoint)
CAUSES = ("truncated_support", "temperature", "prefix_cache", "stale_weights", "staleness", "precision")


@dataclass
class MismatchCheckConfig(CheckConfig):
    """Engine vs trainer log-probs beyond the anchors' alarm levels."""

    patience: int = option(1, "Consecutive suspicious steps before the alert fires.")
    max_abs_k1: float = option(0.1, "Alert when |k1| = |mean(log pi_engine - log pi_train)| exceeds this.")
    max_abs_logp_diff: float = option(0.1, "Alert when the mean |log pi_train - log pi_engine| exceeds this.")
    is_weight_band: list[float] = option([0.5, 2.0], "Alert when the mean importance weight leaves this [lo, hi].")
    min_ess: float = option(0.3, "Alert when the effective sample size of the weights (0-1] falls below this.")
    max_chi2: float = option(1.0, "Alert when chi2_token = mean(w^2) - 1 exceeds this.")
    jump_ratio: float = option(
        5.0, "Alert when the lag-0 mean |delta logp| grows this many times right after a sync ..."
    )
    jump_floor: float = option(0.02, "... and exceeds this (precision noise stays below it).")

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        band = self.is_weight_band
        check(
            problems, len(band) == 2 and 0 <= band[0] < 1 < band[1], f"{p}is_weight_band={band} must be [lo < 1 < hi]"
        )
        for name in ("max_abs_k1", "max_abs_logp_diff", "max_chi2", "jump_floor"):
            check(problems, getattr(self, name) > 0, f"{p}{name}={getattr(self, name)} must be > 0")
        check(problems, 0 < self.min_ess <= 1, f"{p}min_ess={self.min_ess} must be in (0, 1]")
        check(problems, self.jump_ratio > 1, f"{p}jump_ratio={self.jump_ratio} must be > 1")
        return problems


def _group(t: dict[str, float], group: str) -> dict[str, float] | None:
    n = t[f"{group}_tokens"]
    if n <= 0:
        return None
    g = {k: t[f"{group}_{k}"] / n for k in SUM_KEYS}
    signed = g["neg"] + g["pos"]
    return {
        "k1": g["k1"],
        "k3": g["k3"],
        "abs_logp_diff": g["abs_dlogp"],
        "is_weight_mean": g["w"],
        "ess": g["w"] ** 2 / g["w2"] if g["w2"] > 0 else 1.0,
        "chi2_token": g["w2"] - 1.0,
        "neg_share": g["neg"] / signed if signed > 0 else 0.5,
        "slope": _slope(g),
    }


def _slope(g: dict[str, float]) -> float:
    """Least-squares slope of d on the engine's log-prob (means of one group): ``1/T - 1`` when the
    engine's log-probs miss the temperature T (then ``d = (1/T - 1) log pi_engine + a per-context constant``)."""
    var = g["eng2"] - g["eng"] ** 2
    mean_d = -g["k1"]
    return (g["d_eng"] - mean_d * g["eng"]) / var if var > 1e-9 else 0.0


@register_check(MismatchCheckConfig)
class MismatchCheck(HealthCheck):
    name = "mismatch"
    failure = "F8"
    title = "engine and trainer log-probs disagree"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._seen: list[list[int]] = []  # prompt hashes of the last SEEN_STEPS steps (what a prefix cache may hold)
        self._last_abs: float | None = None  # the previous step's lag-0 mean |delta logp|
        self._last_version: int | None = None
        self.cause: str | None = None  # the cause the last finding named (one of CAUSES)

    def measure(self, view: StepView) -> dict[str, float]:
        totals = view.result.mismatch
        out = {f"{g}_{k}": float(totals.get(f"{g}_{k}", 0.0)) for g in GROUPS for k in SUM_KEYS}
        out.update(seen_abs=0.0, seen_tokens=0.0, fresh_abs=0.0, fresh_tokens=0.0)
        passes, r = view.result.passes, view.rollout
        if totals and passes and passes[0].old_logprobs is not None and r.engine_logprobs is not None:
            first = passes[0].old_logprobs
            mask = (r.trained_mask.bool() & first.finite).cpu().numpy()
            # a select: a -inf or NaN engine log-prob at a masked position must not make NaN (0 * inf)
            d = np.where(mask, np.abs((first.logp.float() - r.engine_logprobs.float()).cpu().numpy()), 0.0)
            before = {h for step in self._seen for h in step}  # a set: np.isin costs 30 us on these sizes
            seen_groups = np.fromiter((h in before for h in view.group_prompt_hashes.tolist()), dtype=bool)
            seen = np.repeat(seen_groups, view.group_size)  # as view.prompt_hashes: each group's rows
            out.update(
                seen_abs=float(d[seen].sum()),
                seen_tokens=float(mask[seen].sum()),
                fresh_abs=float(d[~seen].sum()),
                fresh_tokens=float(mask[~seen].sum()),
            )
        self._seen = [*self._seen[-(SEEN_STEPS - 1) :], [int(h) for h in view.group_prompt_hashes]]
        return out

    def _alarms(self, m: dict[str, float]) -> list[str]:
        c, lo_hi = self.cfg, self.cfg.is_weight_band
        alarms = []
        if abs(m["k1"]) > c.max_abs_k1:
            alarms.append(f"|k1| = {abs(m['k1']):.3f} > {c.max_abs_k1}")
        if m["abs_logp_diff"] > c.max_abs_logp_diff:
            alarms.append(f"mean |delta logp| = {m['abs_logp_diff']:.3f} > {c.max_abs_logp_diff}")
        if not lo_hi[0] <= m["is_weight_mean"] <= lo_hi[1]:
            alarms.append(f"mean IS weight = {m['is_weight_mean']:.3f} outside {lo_hi}")
        if m["ess"] < c.min_ess:
            alarms.append(f"ESS = {m['ess']:.3f} < {c.min_ess}")
        if m["chi2_token"] > c.max_chi2:
            alarms.append(f"chi2_token = {m['chi2_token']:.3f} > {c.max_chi2}")
        return alarms

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        lag0, lagged = _group(t, "lag0"), _group(t, "lagged")
        version = view.rollout.weight_version
        synced = version is not None and self._last_version is not None and version != self._last_version
        last_abs, self._last_abs, self._last_version = self._last_abs, None, version
        metrics: dict[str, float] = {}
        alarms, group, jumped = [], None, False
        if lag0 is not None:
            self._last_abs = lag0["abs_logp_diff"]
            metrics.update({f"lag0_{k}": v for k, v in lag0.items()})
            alarms, group = self._alarms(lag0), lag0
            jumped = (
                synced
                and last_abs is not None
                and lag0["abs_logp_diff"] > max(self.cfg.jump_ratio * last_abs, self.cfg.jump_floor)
            )
            if jumped and not alarms:
                alarms = [f"mean |delta logp| jumped from {last_abs:.4f} to {lag0['abs_logp_diff']:.4f} after a sync"]
        if lagged is not None:
            metrics.update({f"lagged_{k}": v for k, v in lagged.items()})
            # Pipelined rollouts train lagged tokens by design; the pipeline_lag check judges their gap,
            # against its own threshold and naming rollout.pipeline.max_lag: one alert, not two.
            pipelined = "pipeline/lag_max" in view.rollout.timing
            if not alarms and not pipelined and self._alarms(lagged):
                alarms, group = [f"lagged samples: {a}" for a in self._alarms(lagged)], lagged
        if not alarms:
            self.cause = None
            return metrics, None
        self.cause = self._cause(t, group, lagged_only=group is lagged, view=view)
        metrics.update({f"cause/{c}": float(c == self.cause) for c in CAUSES})
        evidence = (
            f"the engine's log-probs of its sampled tokens differ from the trainer's ({'; '.join(alarms)}); "
            f"{group['neg_share']:.0%} of the differing tokens are more likely under the engine; "
            f"likely cause: {self.cause.replace('_', ' ')}"
        )
        if self.cause == "prefix_cache":
            evidence += (
                f" (mean |delta logp| {t['seen_abs'] / t['seen_tokens']:.4f} on prompts seen before the sync, "
                f"{t['fresh_abs'] / t['fresh_tokens']:.4f} on new ones)"
            )
        return metrics, Finding(evidence + ".", {**metrics, **{k: v for k, v in group.items()}})

    def _cause(self, t: dict[str, float], g: dict[str, float], lagged_only: bool, view: StepView) -> str:
        if lagged_only:
            return "staleness"
        seen = t["seen_abs"] / t["seen_tokens"] if t["seen_tokens"] else None
        fresh = t["fresh_abs"] / t["fresh_tokens"] if t["fresh_tokens"] else None
        if seen is not None and fresh is not None and seen > 3 * fresh + self.cfg.jump_floor:
            return "prefix_cache"
        expected_slope = 1.0 / view.rollout.temperature - 1.0
        if abs(expected_slope) > 0.1 and abs(g["slope"] - expected_slope) < 0.25 * abs(expected_slope):
            return "temperature"
        if g["neg_share"] >= 0.9:
            return "truncated_support"
        if g["abs_logp_diff"] < self.cfg.jump_floor:
            return "precision"
        return "stale_weights"

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        return CAUSE_TEXT.get(self.cause, CAUSE_TEXT["stale_weights"])


CAUSE_TEXT = {
    "truncated_support": (
        "truncated sampling: the engine draws from a top-p / top-k distribution (more confident than the full "
        "softmax the trainer scores), a bias of log(kept mass) per token; HF's default top_k=50 does it too",
        "sample from the full distribution (rollout.top_p=1, rollout.top_k=0), or correct for it "
        "(an importance-sampling correction in algorithm.*); check the engine applies no top-p/top-k of its own",
    ),
    "temperature": (
        "the engine reports log-probs before the temperature while the trainer divides its logits by "
        "rollout.temperature (vLLM's default raw logprobs)",
        "report processed log-probs (vLLM logprobs_mode=processed_logprobs, --logprobs-mode for a server), or "
        "rollout.temperature=1",
    ),
    "prefix_cache": (
        "a prefix cache reused across a weight sync: prompts the engine saw before the sync are served from "
        "key/values computed with the old weights, new prompts are not",
        "reset the engine's prefix cache after every sync (vLLM reset_prefix_cache), or salt it by weight version",
    ),
    "stale_weights": (
        "stale weights: the engine says it holds the trainer's weight version but samples with other weights "
        "(a sync that failed silently, a LoRA adapter reported loaded that never reached the engine)",
        "verify every sync (rollout.vllm.verify_sync=true); with LoRA check the adapter is loaded and enabled "
        "in the engine; compare the engine's /weight_info with the trainer's step",
    ),
    "staleness": (
        "staleness: samples generated by older weights (async rollouts) drift from the trainer, more the larger "
        "the lag; in sync mode a lag means the sync never reached the engine",
        "lower rollout.max_staleness or rollout.max_off_policy_steps, or correct the lagged tokens "
        "(algorithm.corrections=[tis_token] or [icepop], docs/corrections.md)",
    ),
    "precision": (
        "precision noise (a bf16 engine against a float32 trainer, batch-dependent kernels) accumulated over "
        "long sequences",
        "match the engine's precision to the trainer's (float32 lm_head), or use a token-level correction",
    ),
}
