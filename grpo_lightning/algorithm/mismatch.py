"""The engine-trainer mismatch of one generation batch, measured on every step.

The rollout engine reports the log-prob of every token it sampled (after temperature and
truncation); the trainer computes its own in the first forward pass of the step, before the
update. Their difference is the off-policy gap the loss silently assumes away. Conventions
(those of verl's ``rollout_corr`` metrics, so the numbers compare):

* ``d_t = log pi_train(y_t) - log pi_engine(y_t)``; the importance ratio ``r_t = exp(d_t)``
  (log ratio clamped to +-20 before ``exp``), the sequence ratio ``R = exp(sum_t d_t)``;
* ``k1 = mean(-d)`` (signed: KL(engine || train) by its k1 estimator; verl's ``kl``), positive
  when the engine is more confident than the trainer (truncated sampling);
* ``k3 = mean(r - 1 - d)`` (>= 0), ``chi2_token = mean(r^2) - 1``, ``chi2_seq = mean(R^2) - 1``;
* effective sample size ``ess = mean(r)^2 / mean(r^2)`` (verl's 1 / mean(w~^2), w~ = r / mean(r));
* the IS weight statistics are of the raw ratios (before any correction truncates them);
* ``outside_band_frac``: tokens outside the band of at least one configured correction (each
  correction's ``band()`` on its own statistic, ``Correction.outside``); without a correction the
  default band :data:`DEFAULT_BAND` (token ratio in [0.5, 2], F8's alarm band on the mean weight);
  ``seq_outside_band_frac``: sequences with such a token (for a sequence-level correction: whose
  statistic is outside); ``masked_*``: the tokens (sequences with a token) the combined keep masks
  removed, 0 without a mask correction. With several corrections each also gets its own
  ``outside_band/<name>``, ``seq_outside_band/<name>``, ``masked_token_frac/<name>``, ``masked_seq_frac/<name>``.

Samples the current weights generated (version lag 0) are measured apart from lagged ones,
whose gap mixes staleness with mismatch. :func:`mismatch_sums` returns additive sums and
extremes (they add up over micro-batches and ranks); :func:`mismatch_metrics` turns them into
the ``mismatch/*`` metrics. Pure tensor math in float64, read once per step (one host transfer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from grpo_lightning.algorithm.corrections.base import Band, Correction, CorrectionInputs, CorrectionOutput

LOG_RATIO_CLAMP = 20.0
EARLY_TOKENS = 2  # the first completion tokens, where a stale prefix cache shows most
SIGN_EPS = 1e-3  # |d| below this counts as neither sign (precision noise)
# Additive per-group totals; the extremes are kept apart (max over groups, not sums).
SUMS = (
    "tokens", "seqs", "k1", "k3", "abs_dlogp", "abs_dp", "w", "w2", "outside", "seq_r2", "seq_outside",
    "neg", "pos", "early_abs", "early_tokens", "late_abs", "masked_tokens", "masked_seqs", "eng", "eng2", "d_eng",
)  # fmt: skip
MAXES = ("abs_dlogp_max", "abs_dp_max", "w_max", "negw_max")  # negw_max = -min(r)
GROUPS = ("lag0", "lagged")
# The lagged tokens split by their own lag (a pipelined sequence spans several): (lowest, highest, name).
LAG_BUCKETS = ((1, 1, "1"), (2, 2, "2"), (3, math.inf, "3+"))
LAG_STATS = ("tokens", "k1", "k3", "abs_dlogp")
DEFAULT_BAND = Band("token_ratio", 0.5, 2.0)  # watched when no correction is configured
PER_CORRECTION = {  # summed per correction as "<name>:<key>" -> its metric ``<metric>/<name>``
    "outside": "outside_band",
    "seq_outside": "seq_outside_band",
    "masked_tokens": "masked_token_frac",
    "masked_seqs": "masked_seq_frac",
}


class DefaultBand(Correction):
    """Not a correction (changes nothing): watches :data:`DEFAULT_BAND` when none is configured."""

    name = "default_band"
    is_weight = False

    def compute(self, x: CorrectionInputs) -> CorrectionOutput:
        return CorrectionOutput(None, None)

    def band(self) -> Band:
        return DEFAULT_BAND


def correction_flags(
    corrections: Sequence[Correction],
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor | None = None,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per correction name: ([B, T] outside its band, [B, T] removed by its mask), decided exactly as the
    loss decides (the same float32 :class:`CorrectionInputs`); :class:`DefaultBand` when there is none."""
    on = mask.bool()
    engine = torch.where(on, engine_logp, trainer_logp)  # padding: no NaN in a ratio (as objective.correct)
    adv = torch.zeros(mask.shape[0], device=mask.device) if advantages is None else advantages
    x = CorrectionInputs(trainer_logp.detach(), engine.detach(), on.float(), adv.detach())
    flags = {}
    with torch.no_grad():
        for correction in corrections or [DefaultBand(None)]:
            keep = correction(x).keep
            flags[correction.name] = (correction.outside(x), torch.zeros_like(on) if keep is None else on & ~keep)
    return flags


def _on(on: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` where ``on``, 0 elsewhere: a select, not a product, so a -inf or NaN log-prob at a
    masked position (padding, a non-finite row) stays out of every sum (0 * inf is NaN)."""
    return torch.where(on, x, 0.0)


def _flag_sums(outside, removed, on, seq_on) -> list[torch.Tensor]:
    """The PER_CORRECTION sums of [B, T] float flags over the tokens ``on`` and the sequences ``seq_on`` (bool)."""
    outside, removed = _on(on, outside), _on(on, removed)
    return [
        outside.sum(),
        (outside.sum(dim=1).gt(0) & seq_on).double().sum(),
        removed.sum(),
        (removed.sum(dim=1).gt(0) & seq_on).double().sum(),
    ]


def _group_sums(d, eng, p_train, p_eng, on, seq_on, outside, masked, early) -> list[torch.Tensor]:
    """SUMS then MAXES of the tokens ``on`` and the sequences ``seq_on`` (both bool)."""
    r = torch.exp(d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    seq_r = torch.exp(_on(on, d).sum(dim=1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    outside_n, seq_outside, masked_n, seq_masked = _flag_sums(outside, masked, on, seq_on)
    abs_d, abs_dp = d.abs(), (p_train - p_eng).abs()
    none = d.new_full((), -math.inf)  # the extreme of no token (the group is then not reported)

    def total(x):
        return _on(on, x).sum()

    def extreme(x):
        return torch.where(on, x, none).amax() if x.numel() else none

    return [
        on.double().sum(),
        seq_on.double().sum(),
        total(-d),
        total(r - 1 - d),
        total(abs_d),
        total(abs_dp),
        total(r),
        total(r * r),
        outside_n,
        _on(seq_on, seq_r * seq_r).sum(),
        seq_outside,
        total((d < -SIGN_EPS).float()),
        total((d > SIGN_EPS).float()),
        total(abs_d * early),
        total(early),
        total(abs_d * (1 - early)),
        masked_n,
        seq_masked,
        total(eng),  # with the next two: the slope of d against the engine's log-prob (a temperature gone missing)
        total(eng * eng),
        total(d * eng),
        extreme(abs_d),
        extreme(abs_dp),
        extreme(r),
        extreme(-r),  # min(r) = -max(-r)
    ]


@torch.no_grad()
def mismatch_sums(
    trainer_logp: torch.Tensor,
    engine_logp: torch.Tensor,
    mask: torch.Tensor,
    lag: torch.Tensor | None = None,
    flags: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> dict[str, float]:
    """Totals of the mismatch of [B, T] log-probs over the tokens ``mask`` marks, per group
    (``lag0_*`` and ``lagged_*``) plus ``lag_sum`` / ``lag_max`` over all tokens.

    ``lag`` [B, T] (or [B]) is each token's version lag (optimizer steps between the weights
    that sampled it and the trainer's; None: 0); ``flags`` the corrections' (outside, removed)
    [B, T] of :func:`correction_flags` (None: the default band's). A sequence is lagged if any of its
    tokens is. With several corrections each one's PER_CORRECTION sums come as ``<group>_<name>:<key>``.
    """
    if flags is None:
        flags = correction_flags((), trainer_logp, engine_logp, mask)
    # float64: the variance of the weights is a difference of nearly equal sums (cheap at [B, T]).
    on = mask > 0
    trainer_logp, engine_logp = trainer_logp.detach().double(), engine_logp.detach().double()
    d = _on(on, trainer_logp - engine_logp)  # padding: d = 0, whatever either side wrote there
    p_train, p_eng = _on(on, trainer_logp.exp()), _on(on, engine_logp.exp())
    no_lag = lag is None
    lag = torch.zeros(on.shape, dtype=torch.float64, device=on.device) if lag is None else _on(on, lag.double())
    per = {name: (outside.double(), removed.double()) for name, (outside, removed) in flags.items()}
    outside = torch.stack([o for o, _ in per.values()]).amax(dim=0)  # outside at least one band
    masked = torch.stack([r for _, r in per.values()]).amax(dim=0)  # removed by at least one mask
    position = torch.cumsum(on.double(), dim=1)
    early = ((position <= EARLY_TOKENS) & on).double()
    seq_real = on.any(dim=1)
    seq_lagged = (lag > 0).any(dim=1)
    own = [f"{name}:{k}" for name in per for k in PER_CORRECTION] if len(per) > 1 else []
    values = []
    # Without lags (an engine on the trainer's weights) no sequence is lagged: that group's sums are
    # 0 and its extremes -inf, as computing them over no token gives, at no cost.
    for lagged in (False, True) if not no_lag else (False,):
        seq_on = seq_real & (seq_lagged == lagged)
        group_on = on & seq_on[:, None]
        values += _group_sums(d, _on(on, engine_logp), p_train, p_eng, group_on, seq_on, outside, masked, early)
        if len(per) > 1:
            values += [v for o, r in per.values() for v in _flag_sums(o, r, group_on, seq_on)]
    values += [lag.sum(), lag.amax() if lag.numel() else lag.new_zeros(())]
    if not no_lag:
        values += _lag_bucket_sums(d, on, lag)
    flat = torch.stack(values).double().tolist()  # the one host read
    if no_lag:
        flat[-2:-2] = [0.0] * len(SUMS) + [-math.inf] * len(MAXES) + [0.0] * len(own)
        flat += [0.0] * (len(LAG_BUCKETS) * len(LAG_STATS))
    keys = [f"{g}_{k}" for g in GROUPS for k in (*SUMS, *MAXES, *own)] + ["lag_sum", "lag_max"]
    keys += [f"by_lag{name}_{k}" for _, _, name in LAG_BUCKETS for k in LAG_STATS]
    return dict(zip(keys, flat, strict=True))


def _lag_bucket_sums(d: torch.Tensor, on: torch.Tensor, lag: torch.Tensor) -> list[torch.Tensor]:
    """LAG_STATS of the tokens of each LAG_BUCKETS lag, token by token (not by sequence, as the groups)."""
    r = torch.exp(d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    out = []
    for low, high, _ in LAG_BUCKETS:
        bucket = on & (lag >= low) & (lag <= high)
        out += [bucket.double().sum(), _on(bucket, -d).sum(), _on(bucket, r - 1 - d).sum(), _on(bucket, d.abs()).sum()]
    return out


def add_sums(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Two sets of :func:`mismatch_sums` totals as one (sums add, extremes take the larger)."""
    if not a:
        return dict(b)
    return {k: max(a[k], b[k]) if k.endswith("_max") else a[k] + b[k] for k in a}


def group_metrics(sums: dict[str, float], group: str) -> dict[str, float]:
    """The metrics of one group (``lag0`` or ``lagged``) of :func:`mismatch_sums` totals; empty if it has no token."""
    s = {k[len(group) + 1 :]: v for k, v in sums.items() if k.startswith(group + "_")}
    n, seqs = s["tokens"], s["seqs"]
    if n <= 0:
        return {}
    w_mean, w2_mean = s["w"] / n, s["w2"] / n
    return {
        "k1": s["k1"] / n,
        "k3": s["k3"] / n,
        "abs_logp_diff_mean": s["abs_dlogp"] / n,
        "abs_logp_diff_max": s["abs_dlogp_max"],
        "abs_p_diff_mean": s["abs_dp"] / n,
        "abs_p_diff_max": s["abs_dp_max"],
        "is_weight_mean": w_mean,
        "is_weight_std": math.sqrt(max(w2_mean - w_mean * w_mean, 0.0)),
        "is_weight_min": -s["negw_max"],
        "is_weight_max": s["w_max"],
        "ess": w_mean * w_mean / w2_mean if w2_mean > 0 else 1.0,
        "outside_band_frac": s["outside"] / n,
        "seq_outside_band_frac": s["seq_outside"] / max(seqs, 1.0),
        "masked_token_frac": s["masked_tokens"] / n,
        "masked_seq_frac": s["masked_seqs"] / max(seqs, 1.0),
        **_per_correction(s, n, max(seqs, 1.0)),
        "chi2_token": w2_mean - 1.0,
        "chi2_seq": s["seq_r2"] / max(seqs, 1.0) - 1.0,
        "tokens": n,
    }


def _per_correction(s: dict[str, float], tokens: float, seqs: float) -> dict[str, float]:
    """``outside_band/<name>`` etc. from the ``<name>:<key>`` sums (present with several corrections)."""
    out = {}
    for key, value in s.items():
        if ":" in key:
            name, stat = key.split(":")
            out[f"{PER_CORRECTION[stat]}/{name}"] = value / (
                seqs if stat.startswith(("seq_", "masked_seqs")) else tokens
            )
    return out


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """``mismatch/*`` (lag-0 samples), ``mismatch/lagged/*``, the version lag and ``mismatch/by_lag/<1|2|3+>/*``
    (the lagged tokens by their own lag) from :func:`mismatch_sums` totals."""
    metrics = {f"mismatch/{k}": v for k, v in group_metrics(sums, "lag0").items()}
    metrics.update({f"mismatch/lagged/{k}": v for k, v in group_metrics(sums, "lagged").items()})
    tokens = sums["lag0_tokens"] + sums["lagged_tokens"]
    if tokens > 0:
        metrics["mismatch/version_lag_mean"] = sums["lag_sum"] / tokens
        metrics["mismatch/version_lag_max"] = sums["lag_max"]
    for _, _, name in LAG_BUCKETS:  # the lagged tokens by their lag: does the gap grow with it?
        n = sums.get(f"by_lag{name}_tokens", 0.0)
        if n > 0:
            prefix, s = f"mismatch/by_lag/{name}/", {k: sums[f"by_lag{name}_{k}"] for k in LAG_STATS}
            metrics.update({prefix + "k1": s["k1"] / n, prefix + "k3": s["k3"] / n, prefix + "tokens": n})
            metrics[prefix + "abs_logp_diff_mean"] = s["abs_dlogp"] / n
    return metrics
