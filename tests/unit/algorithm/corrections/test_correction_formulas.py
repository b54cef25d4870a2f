"""Every registered correction against a float64 reference of its published formula, on random
tensors with padding, plus the properties every correction must have."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_lightning.algorithm.corrections import CORRECTIONS, CorrectionInputs, apply_corrections
from grpo_lightning.algorithm.corrections.geo_mask import GeoMaskOptions
from grpo_lightning.algorithm.corrections.opsm import OpsmOptions
from grpo_lightning.algorithm.corrections.rejection import AGGREGATIONS, ESTIMATORS, RejectionOptions

CLAMP = 20.0
CASES = 40


def _batch(seed: int, scale: float = 0.3, rows: int = 6, cols: int = 9):
    g = torch.Generator().manual_seed(seed)
    engine = -torch.rand(rows, cols, generator=g, dtype=torch.float64) * 3
    train = engine + torch.randn(rows, cols, generator=g, dtype=torch.float64) * scale
    lengths = torch.randint(0, cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols)[None] < lengths[:, None]).double()
    engine = torch.where(mask > 0, engine, torch.nan)  # padding carries garbage
    advantages = torch.randn(rows, generator=g, dtype=torch.float64)
    return train, engine, mask, advantages


def _inputs(train, engine, mask, advantages):
    return CorrectionInputs(train.float(), engine.float(), mask.float(), advantages.float())


# ----------------------------------------------------------------- float64 references
def _ref_parts(train, engine, mask):
    on = mask > 0
    d = torch.where(on, train - engine, 0.0)
    n = mask.sum(1).clamp(min=1)
    return on, d, n


def _ref_options(name):
    return {
        "geo_mask": GeoMaskOptions(lower=0.9, upper=1.08),
        "opsm": OpsmOptions(delta=0.05),
        "rejection": RejectionOptions(upper=0.05),
    }.get(name, CORRECTIONS.options(name)())


def reference(name, options, train, engine, mask, adv):
    """(weight [B, T] or None, keep [B, T] or None) in float64, written from the formulas."""
    on, d, n = _ref_parts(train, engine, mask)
    dc = d.clamp(-CLAMP, CLAMP)  # each token's log-ratio clamped first (verl's convention)
    r = torch.exp(dc)
    seq = lambda v: v[:, None].expand_as(d)  # noqa: E731
    R = seq(torch.exp(d.sum(1).clamp(-CLAMP, CLAMP)))  # the sequence weights clamp the sum
    o = options
    if name == "tis_token":
        return torch.minimum(r, torch.tensor(o.cap, dtype=torch.float64)), None
    if name == "tis_seq":
        return R.clamp(max=o.cap), None
    if name in ("mis_token", "icepop"):
        return torch.where((r >= o.lower) & (r <= o.upper), r, 0.0), None
    if name == "mis_seq":
        return torch.where((R >= o.lower) & (R <= o.upper), R, 0.0), None
    if name == "geo_mask":
        G = torch.exp(dc.sum(1) / n)
        return None, seq((G >= o.lower) & (G <= o.upper))
    if name == "k3_seq_mask":
        k3 = torch.where(on, torch.exp(dc) - 1 - dc, 0.0).sum(1) / n
        return None, seq(k3 <= o.threshold)
    if name == "opsm":
        return None, seq(~((adv < 0) & ((-dc).sum(1) / n > o.delta)))
    if name == "veto":
        return None, seq(~(on & (r < o.threshold)).any(1))
    if name == "rejection":
        k = {"k1": -dc, "k2": dc * dc / 2, "k3": torch.exp(dc) - 1 - dc}[o.estimator]
        if o.aggregation == "token":
            stat = k
        elif o.aggregation == "seq_max":
            stat = seq(torch.where(on, k, -math.inf).amax(1).nan_to_num(neginf=0.0))
        else:
            total = torch.where(on, k, 0.0).sum(1)
            stat = seq(total / n if o.aggregation == "seq_mean" else total)
        if o.estimator == "k1":
            lower = o.lower if o.lower is not None else 1 / o.upper
            return None, (stat >= math.log(lower)) & (stat <= math.log(o.upper))
        return None, stat <= o.upper
    raise KeyError(name)


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_each_correction_matches_its_float64_formula(name):
    options = _ref_options(name)
    for seed in range(CASES):
        train, engine, mask, adv = _batch(seed)
        out = CORRECTIONS[name](options)(_inputs(train, engine, mask, adv))
        want_w, want_keep = reference(name, options, train, engine, mask, adv)
        on = mask > 0
        if want_w is None:
            assert out.weight is None
        else:
            torch.testing.assert_close(out.weight.double()[on], want_w[on], rtol=1e-5, atol=1e-6)
        if want_keep is None:
            assert out.keep is None
        else:
            # a statistic within float32 rounding of a threshold may fall either way
            agree = (out.keep[on] == want_keep[on]).float().mean()
            assert agree >= 0.98, (name, seed)


def _extreme_batch(seed: int, rows: int = 8, cols: int = 9):
    """A batch where some rows hold log-ratios beyond +-20: a pair of opposite extremes (their
    clamped values cancel, their raw values need not) or a single one, beside small drifts."""
    train, engine, mask, adv = _batch(seed, scale=0.2, rows=rows, cols=cols)
    g = torch.Generator().manual_seed(1000 + seed)
    lengths = mask.sum(1).long()
    for row in range(rows):
        kind = int(torch.randint(0, 3, (), generator=g))  # 0: none, 1: one extreme, 2: an opposite pair
        if kind == 0 or lengths[row] < kind:
            continue
        where = torch.randperm(int(lengths[row]), generator=g)[:kind]
        size = 20.0 + torch.rand(kind, generator=g, dtype=torch.float64) * 60.0
        sign = torch.tensor([1.0, -1.0], dtype=torch.float64)[:kind] * (1 if torch.rand((), generator=g) < 0.5 else -1)
        train[row, where] = engine[row, where] + sign * size
    return train, engine, mask, adv


_MASK_STATISTICS = {  # each mask's sequence statistic from per-token clamped d, in float64 (ratios as logs)
    "geo_mask": lambda dc, on, n: dc.sum(1) / n,
    "opsm": lambda dc, on, n: (-dc).sum(1) / n,
    "k3_seq_mask": lambda dc, on, n: torch.where(on, torch.exp(dc) - 1 - dc, 0.0).sum(1) / n,
    "veto": lambda dc, on, n: torch.where(on, dc, math.inf).amin(1).nan_to_num(posinf=0.0),
}
_RATIO_STATISTICS = ("geo_mask", "veto")  # G and min_t r_t, compared as logs


@pytest.mark.parametrize("name", list(_MASK_STATISTICS))
def test_sequence_masks_clamp_each_tokens_log_ratio_before_the_mean(name):
    """verl's convention for every mask: clamp each d_t to +-20, then average (sum, min). Averaging
    the raw log-ratios lets one token of d = 60 move a sequence's mean by 40 / length more."""
    options = {
        "geo_mask": GeoMaskOptions(lower=0.5, upper=2.0),
        "opsm": OpsmOptions(delta=0.5),
        "k3_seq_mask": CORRECTIONS.options("k3_seq_mask")(threshold=1.0),
        "veto": CORRECTIONS.options("veto")(threshold=1e-4),
    }[name]
    correction = CORRECTIONS[name](options)
    clamp_mattered = 0
    for seed in range(CASES):
        train, engine, mask, adv = _extreme_batch(seed)
        on, d, n = _ref_parts(train, engine, mask)
        x = _inputs(train, engine, mask, adv)
        want = _MASK_STATISTICS[name](d.clamp(-CLAMP, CLAMP), on, n)
        rows = on.any(1)
        got = correction.statistic(x)[:, 0].double()
        got = got.log() if name in _RATIO_STATISTICS else got
        torch.testing.assert_close(got[rows], want[rows], rtol=1e-4, atol=1e-4, msg=lambda m, s=seed: f"seed {s}: {m}")
        _, want_keep = reference(name, options, train, engine, mask, adv)
        assert torch.equal(correction(x).keep[on], want_keep[on]), seed
        raw = _MASK_STATISTICS[name](d, on, n)
        clamp_mattered += int(((raw - want).abs() > 1e-3)[rows].sum())
    assert clamp_mattered > CASES  # the extremes reached the statistics: the clamp was tested


@pytest.mark.parametrize(
    ("estimator", "aggregation"),
    # k1 at seq_max is refused at config time (tested with the config rules)
    [(e, a) for e in ESTIMATORS for a in AGGREGATIONS if (e, a) != ("k1", "seq_max")],
)
def test_rejection_matches_at_every_estimator_and_aggregation(estimator, aggregation):
    options = RejectionOptions(estimator=estimator, aggregation=aggregation, upper=1.2 if estimator == "k1" else 0.05)
    for seed in range(CASES // 4):
        train, engine, mask, adv = _batch(seed, scale=0.2)
        out = CORRECTIONS["rejection"](options)(_inputs(train, engine, mask, adv))
        _, want = reference("rejection", options, train, engine, mask, adv)
        on = mask > 0
        assert (out.keep[on] == want[on]).float().mean() >= 0.98


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_identical_logprobs_give_weight_one_and_mask_nothing(name):
    for seed in range(10):
        train, _, mask, adv = _batch(seed)
        out = CORRECTIONS[name](_ref_options(name))(_inputs(train, train, mask, adv))
        if out.weight is not None:
            assert torch.equal(out.weight, torch.ones_like(out.weight))
        if out.keep is not None:
            assert bool(out.keep.all())


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_weights_carry_no_gradient_and_padding_stays_finite(name):
    train, engine, mask, adv = _batch(3, scale=30.0)  # far apart: every clamp is hit
    mask[0] = 0  # a fully masked row
    x = CorrectionInputs(train.float().requires_grad_(), engine.float(), mask.float(), adv.float())
    out = CORRECTIONS[name](_ref_options(name))(x)
    if out.weight is not None:
        assert not out.weight.requires_grad
        assert bool(torch.isfinite(out.weight).all())
        assert torch.equal(out.weight[0], torch.ones_like(out.weight[0]))
    if out.keep is not None:
        assert bool(out.keep[0].all())


def test_geo_mask_decides_the_same_at_10_and_1000_tokens():
    correction = CORRECTIONS["geo_mask"](GeoMaskOptions(lower=0.95, upper=1.05))
    g = torch.Generator().manual_seed(0)
    for drift in torch.linspace(-0.1, 0.1, 41):
        decisions = []
        for length in (10, 1000):
            engine = -torch.rand(1, length, generator=g)
            x = CorrectionInputs(engine + drift, engine, torch.ones(1, length), torch.zeros(1))
            decisions.append(bool(correction(x).keep.all()))
        assert decisions[0] == decisions[1], float(drift)
        low, high = math.log(0.95), math.log(1.05)
        if min(abs(float(drift) - low), abs(float(drift) - high)) > 1e-3:  # float32 sums at the edge may go either way
            assert decisions[0] == (low < float(drift) < high)


def test_opsm_never_masks_a_non_negative_advantage():
    correction = CORRECTIONS["opsm"](OpsmOptions(delta=1e-4))
    for seed in range(CASES):
        train, engine, mask, adv = _batch(seed, scale=3.0)
        adv[::2] = adv[::2].abs()
        adv[1] = 0.0
        keep = correction(_inputs(train, engine, mask, adv)).keep
        assert bool(keep[adv >= 0].all())


def test_combined_weights_multiply_and_masks_and():
    names = ["tis_token", "icepop", "k3_seq_mask", "veto"]
    corrections = [CORRECTIONS[n](_ref_options(n)) for n in names]
    for seed in range(10):
        x = _inputs(*_batch(seed, scale=0.5))
        combined = apply_corrections(corrections, x)
        outs = [c(x) for c in corrections]
        torch.testing.assert_close(combined.weights, outs[0].weight * outs[1].weight)
        assert torch.equal(combined.keep, outs[2].keep & outs[3].keep)
        assert combined.masked_tokens == float((x.on & ~combined.keep).sum())


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_band_outside_is_consistent_with_the_decision(name):
    correction = CORRECTIONS[name](_ref_options(name))
    band = correction.band()
    assert band is not None and (band.low is not None or band.high is not None)
    x = _inputs(*_batch(5, scale=1.0))
    outside = correction.outside(x)
    out = correction(x)
    if name in ("tis_token", "tis_seq"):  # truncated exactly where outside the band
        assert torch.equal(outside, x.on & (out.weight < correction.statistic(x)))
    elif out.weight is not None:  # a banded weight is zero exactly outside
        assert torch.equal(outside, x.on & (out.weight == 0))
    elif name != "opsm":  # opsm also needs a negative advantage
        assert torch.equal(outside, x.on & ~out.keep)
