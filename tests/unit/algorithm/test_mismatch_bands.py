"""``mismatch/*``'s band and mask fractions come from the configured corrections: each against a
float64 reference of its band statistic on random tensors, per correction when several are set."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_lightning.algorithm.corrections import CORRECTIONS, CorrectionInputs, apply_corrections, selected_corrections
from grpo_lightning.algorithm.mismatch import DEFAULT_BAND, correction_flags, mismatch_metrics, mismatch_sums
from grpo_lightning.config.algorithm import AlgorithmConfig
from grpo_lightning.records import RolloutBatch, TokenLogProbs
from grpo_lightning.step.passes import measure_mismatch

OPTIONS = {  # thresholds a 0.3-nat drift crosses often enough to test both sides
    "tis_token": {"cap": 1.2},
    "tis_seq": {"cap": 1.5},
    "mis_token": {"lower": 0.8, "upper": 1.25},
    "icepop": {"lower": 0.8, "upper": 1.25},
    "mis_seq": {"lower": 0.5, "upper": 2.0},
    "geo_mask": {"lower": 0.9, "upper": 1.08},
    "k3_seq_mask": {"threshold": 0.03},
    "opsm": {"delta": 0.05},
    "veto": {"threshold": 0.6},
    "rejection": {"upper": 0.05},
}
FRACTIONS = ("outside_band_frac", "seq_outside_band_frac", "masked_token_frac", "masked_seq_frac")


def _build(name):
    return CORRECTIONS[name](CORRECTIONS.options(name)(**OPTIONS[name]))


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    b, t = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 12, (1,), generator=g))
    engine = -torch.rand(b, t, generator=g) * 3
    trainer = engine + torch.randn(b, t, generator=g) * 0.3
    mask = torch.arange(t)[None, :] < torch.randint(0, t + 1, (b,), generator=g)[:, None]
    engine = torch.where(mask, engine, torch.nan)  # the engine's padding is garbage
    return trainer, engine, mask, torch.randn(b, generator=g)


def _reference(name, trainer, engine, mask, adv):
    """float64 numpy: (outside [B, T], removed [B, T]) on the masked tokens, from the formulas."""
    o, m = OPTIONS[name], mask.numpy()
    d = np.where(m, trainer.double().numpy() - engine.double().numpy(), 0.0)
    n = np.maximum(m.sum(1), 1)
    r = np.exp(d)
    per_row = lambda v: np.broadcast_to(v[:, None], d.shape)  # noqa: E731
    big_r, mean_d = per_row(np.exp(d.sum(1))), per_row(d.sum(1) / n)
    k3 = np.where(m, r - 1 - d, 0.0)
    stat, lo, hi = {
        "tis_token": (r, None, o.get("cap")),
        "tis_seq": (big_r, None, o.get("cap")),
        "mis_token": (r, o.get("lower"), o.get("upper")),
        "icepop": (r, o.get("lower"), o.get("upper")),
        "mis_seq": (big_r, o.get("lower"), o.get("upper")),
        "geo_mask": (np.exp(mean_d), o.get("lower"), o.get("upper")),
        "k3_seq_mask": (per_row(k3.sum(1) / n), None, o.get("threshold")),
        "opsm": (-mean_d, None, o.get("delta")),
        "veto": (per_row(np.where(m, r, np.inf).min(1)), o.get("threshold"), None),
        "rejection": (k3, None, o.get("upper")),  # its defaults: k3 per token
    }[name]
    outside = m & (((stat < lo) if lo is not None else False) | ((stat > hi) if hi is not None else False))
    if CORRECTIONS[name].is_weight:
        return outside, np.zeros_like(m)
    return outside, outside & per_row(adv.numpy() < 0) if name == "opsm" else outside


def _fractions(outside, removed, mask):
    n, seqs = mask.sum(), max(mask.any(1).sum(), 1)
    return dict(
        zip(
            FRACTIONS,
            (outside.sum() / n, outside.any(1).sum() / seqs, removed.sum() / n, removed.any(1).sum() / seqs),
            strict=True,
        )
    )


def _metrics(corrections, trainer, engine, mask, adv):
    flags = correction_flags(corrections, trainer, engine, mask, adv)
    return mismatch_metrics(mismatch_sums(trainer, engine, mask, flags=flags))


@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_each_corrections_fractions_equal_its_float64_formula(name):
    seen = np.zeros(4)
    for seed in range(25):
        trainer, engine, mask, adv = _case(seed)
        if not mask.any():
            continue
        metrics = _metrics([_build(name)], trainer, engine, mask, adv)
        want = _fractions(*_reference(name, trainer, engine, mask, adv), mask.numpy())
        for key, value in want.items():
            assert metrics[f"mismatch/{key}"] == pytest.approx(value, abs=1e-12), (key, seed)
        assert not any("/" in k.removeprefix("mismatch/") for k in metrics if "band/" in k)  # one: no per-name
        seen += np.array(list(want.values())) > 0
    assert seen[0] > 0 and (seen[2] > 0 or CORRECTIONS[name].is_weight)  # the cases did cross the thresholds


def test_several_corrections_each_get_their_own_fractions_and_the_totals_are_their_union():
    names = ["icepop", "geo_mask", "opsm", "tis_seq"]
    for seed in range(25):
        trainer, engine, mask, adv = _case(seed)
        if not mask.any():
            continue
        metrics = _metrics([_build(n) for n in names], trainer, engine, mask, adv)
        refs = {n: _reference(n, trainer, engine, mask, adv) for n in names}
        for name, (outside, removed) in refs.items():
            for key, value in _fractions(outside, removed, mask.numpy()).items():
                stem = {"outside_band_frac": "outside_band", "seq_outside_band_frac": "seq_outside_band"}.get(key, key)
                assert metrics[f"mismatch/{stem}/{name}"] == pytest.approx(value, abs=1e-12), (name, key, seed)
        union = [np.any([refs[n][i] for n in names], axis=0) for i in (0, 1)]
        for key, value in _fractions(*union, mask.numpy()).items():
            assert metrics[f"mismatch/{key}"] == pytest.approx(value, abs=1e-12), (key, seed)


def test_the_masked_fractions_equal_what_the_loss_removed():
    names = ["geo_mask", "veto", "rejection", "opsm"]
    for seed in range(15):
        trainer, engine, mask, adv = _case(seed)
        corrections = [_build(n) for n in names]
        x = CorrectionInputs(trainer, torch.where(mask, engine, trainer), mask.float(), adv)
        loss_side = apply_corrections(corrections, x)
        metrics = _metrics(corrections, trainer, engine, mask, adv)
        n = float(mask.sum())
        if n:
            assert metrics["mismatch/masked_token_frac"] * n == pytest.approx(loss_side.masked_tokens)
            assert metrics["mismatch/masked_seq_frac"] * float(mask.any(1).sum()) == pytest.approx(
                loss_side.masked_seqs
            )


@pytest.mark.parametrize("names", [[], *([n] for n in CORRECTIONS), list(CORRECTIONS)])
def test_identical_logprobs_give_nothing_outside_and_nothing_masked(names):
    for seed in range(8):
        trainer, _, mask, adv = _case(seed)
        if not mask.any():
            continue
        metrics = _metrics([_build(n) for n in names], trainer, trainer.clone(), mask, adv)
        fractions = {k: v for k, v in metrics.items() if any(f in k for f in ("outside_band", "masked_"))}
        assert len(fractions) == 4 * (1 + len(names) * (len(names) > 1))
        assert all(v == 0.0 for v in fractions.values()), fractions


def test_without_a_correction_the_default_band_is_watched_and_nothing_is_masked():
    assert (DEFAULT_BAND.statistic, DEFAULT_BAND.low, DEFAULT_BAND.high) == ("token_ratio", 0.5, 2.0)
    trainer = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    engine = trainer - torch.log(torch.tensor([[1.0, 2.5, 0.4], [1.0, 1.9, 1.0]]))  # ratios r = these
    m = _metrics([], trainer, engine, torch.ones(2, 3, dtype=torch.bool), None)
    assert m["mismatch/outside_band_frac"] == pytest.approx(2 / 6)
    assert m["mismatch/seq_outside_band_frac"] == pytest.approx(1 / 2)
    assert m["mismatch/masked_token_frac"] == m["mismatch/masked_seq_frac"] == 0.0


def _rollout(engine):
    n, c = engine.shape
    return RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, c, dtype=torch.long),
        completion_mask=torch.ones(n, c, dtype=torch.long),
        rewards=torch.zeros(n),
        group_size=1,
        max_new_tokens=c,
        temperature=1.0,
        engine_logprobs=engine,
    )


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        ({"corrections": ["icepop", "veto"]}, ["icepop", "veto"]),
        ({"is_level": "sequence", "is_cap": 1.5}, []),  # deprecated: tis_seq with cap=is_cap
        ({}, []),
    ],
)
def test_the_step_hook_reads_the_configured_corrections(settings, names):
    trainer, engine, _, adv = _case(3)
    mask = torch.ones_like(trainer, dtype=torch.bool)
    engine = trainer + torch.randn(trainer.shape, generator=torch.Generator().manual_seed(0)) * 0.3
    cfg = AlgorithmConfig(beta=0.0, **settings)
    corrections = selected_corrections(cfg)
    logprobs = TokenLogProbs(trainer, None, mask)
    metrics = mismatch_metrics(measure_mismatch(_rollout(engine), logprobs, 0, corrections, adv))
    assert metrics == _metrics(corrections, trainer, engine, mask, adv)
    assert {k.split("/")[-1] for k in metrics if k.startswith("mismatch/outside_band/")} == set(names)
    if settings.get("is_level"):
        outside = (torch.exp((trainer - engine).double().sum(1)) > 1.5).double().mean()
        assert metrics["mismatch/seq_outside_band_frac"] == pytest.approx(float(outside))
