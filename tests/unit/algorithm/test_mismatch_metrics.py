"""The mismatch metrics against float64 references of their formulas, over many random cases."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from grpo_lightning.algorithm.corrections import CORRECTIONS
from grpo_lightning.algorithm.corrections.geo_mask import GeoMaskOptions
from grpo_lightning.algorithm.corrections.icepop import IcepopOptions
from grpo_lightning.algorithm.mismatch import add_sums, correction_flags, mismatch_metrics, mismatch_sums
from grpo_lightning.callbacks.health import HealthMonitor
from grpo_lightning.config import AlgorithmConfig, HealthConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.records import RolloutBatch, TokenLogProbs
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.passes import measure_mismatch, version_lag


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    b, t = int(torch.randint(1, 7, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    engine = -torch.rand(b, t, generator=g) * 4
    trainer = engine + torch.randn(b, t, generator=g) * float(torch.rand(1, generator=g)) * 0.5
    lengths = torch.randint(0, t + 1, (b,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    lag = torch.randint(0, 3, (b, 1), generator=g).expand(b, t) * (torch.rand(b, 1, generator=g) < 0.5)
    return trainer, engine, mask, lag


def _reference(trainer, engine, mask, lag, band, lagged):
    """float64 numpy: the metrics of the sequences with (lagged) or without lag, straight from the formulas."""
    tr, en, m = trainer.double().numpy(), engine.double().numpy(), mask.numpy()
    seq_lagged = (lag.numpy() * m > 0).any(axis=1)
    rows = [i for i in range(len(m)) if m[i].any() and seq_lagged[i] == lagged]
    d = np.concatenate([(tr[i] - en[i])[m[i]] for i in rows]) if rows else np.array([])
    if d.size == 0:
        return None
    r = np.exp(d)
    big_r = np.array([np.exp((tr[i] - en[i])[m[i]].sum()) for i in rows])
    seq_out = [((np.exp(tr[i] - en[i])[m[i]] < band[0]) | (np.exp(tr[i] - en[i])[m[i]] > band[1])).any() for i in rows]
    dp = np.abs(np.concatenate([(np.exp(tr[i]) - np.exp(en[i]))[m[i]] for i in rows]))
    return {
        "k1": np.mean(-d),
        "k3": np.mean(r - 1 - d),
        "abs_logp_diff_mean": np.mean(np.abs(d)),
        "abs_logp_diff_max": np.max(np.abs(d)),
        "abs_p_diff_mean": dp.mean(),
        "abs_p_diff_max": dp.max(),
        "is_weight_mean": r.mean(),
        "is_weight_std": r.std(),
        "is_weight_min": r.min(),
        "is_weight_max": r.max(),
        "ess": 1.0 / np.mean((r / r.mean()) ** 2),
        "outside_band_frac": np.mean((r < band[0]) | (r > band[1])),
        "seq_outside_band_frac": np.mean(seq_out),  # a sequence with a token outside
        "chi2_token": np.mean(r**2) - 1,
        "chi2_seq": np.mean(big_r**2) - 1,
    }


@pytest.mark.parametrize("seed", range(60))
def test_metrics_match_float64_formulas(seed):
    trainer, engine, mask, lag = _case(seed)
    band = (0.9, 1.1)
    icepop = CORRECTIONS["icepop"](IcepopOptions(*band))  # its band is the token ratio's [lower, upper]
    metrics = mismatch_metrics(
        mismatch_sums(trainer, engine, mask, lag, correction_flags([icepop], trainer, engine, mask))
    )
    for lagged, prefix in ((False, "mismatch/"), (True, "mismatch/lagged/")):
        expected = _reference(trainer, engine, mask, lag, band, lagged)
        if expected is None:
            assert f"{prefix}k1" not in metrics
            continue
        for key, value in expected.items():
            assert metrics[prefix + key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    if mask.any():
        on = mask.numpy()
        assert metrics["mismatch/version_lag_max"] == lag.numpy()[on].max()
        assert metrics["mismatch/version_lag_mean"] == pytest.approx(lag.numpy()[on].mean())


@pytest.mark.parametrize("seed", range(20))
def test_identical_logprobs_give_weight_one_and_no_gap(seed):
    _, engine, mask, _ = _case(seed)
    metrics = mismatch_metrics(mismatch_sums(engine, engine, mask))
    if not mask.any():
        assert metrics == {}
        return
    for key in ("k1", "k3", "abs_logp_diff_max", "abs_p_diff_max", "chi2_token", "chi2_seq", "outside_band_frac"):
        assert metrics[f"mismatch/{key}"] == pytest.approx(0.0, abs=1e-6), key
    assert metrics["mismatch/ess"] == pytest.approx(1.0)
    assert metrics["mismatch/is_weight_min"] == metrics["mismatch/is_weight_max"] == pytest.approx(1.0)
    assert "mismatch/lagged/k1" not in metrics and metrics["mismatch/version_lag_max"] == 0


@pytest.mark.parametrize("seed", range(20))
def test_sums_add_over_row_splits_as_one_batch(seed):
    """Micro-batches (or ranks) measured apart and added give the whole batch's metrics."""
    trainer, engine, mask, lag = _case(seed)
    whole = mismatch_metrics(mismatch_sums(trainer, engine, mask, lag))
    cut = trainer.shape[0] // 2
    parts = {}
    for rows in (slice(0, cut), slice(cut, None)):
        parts = add_sums(parts, mismatch_sums(trainer[rows], engine[rows], mask[rows], lag[rows]))
    split = mismatch_metrics(parts)
    assert split.keys() == whole.keys()
    for key in whole:
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-6), key


def test_k3_is_nonnegative_and_k1_sign_says_who_is_more_confident():
    engine = torch.log(torch.full((4, 5), 0.5))
    sharper_engine = mismatch_metrics(mismatch_sums(engine - 0.2, engine, torch.ones(4, 5)))
    assert sharper_engine["mismatch/k1"] == pytest.approx(0.2) and sharper_engine["mismatch/k3"] > 0
    assert mismatch_metrics(mismatch_sums(engine + 0.2, engine, torch.ones(4, 5)))["mismatch/k1"] == pytest.approx(-0.2)


def test_masked_fractions_count_what_the_correction_removed_and_huge_gaps_stay_finite():
    trainer = torch.tensor([[0.0, -100.0, 0.0], [0.0, 0.0, 0.0]])
    engine = torch.tensor([[-100.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    masked = torch.tensor([[1, 0, 1], [0, 0, 0]])  # the padding token does not count
    m = mismatch_metrics(mismatch_sums(trainer, engine, mask, flags={"x": (torch.zeros_like(mask), masked)}))
    assert m["mismatch/masked_token_frac"] == pytest.approx(1 / 5)
    assert m["mismatch/masked_seq_frac"] == pytest.approx(1 / 2)
    assert all(math.isfinite(v) for v in m.values())
    assert m["mismatch/is_weight_max"] == pytest.approx(math.exp(20.0))  # the log ratio is clamped


def test_the_step_hook_counts_lags_from_the_token_versions_and_skips_engines_without_logprobs():
    n, c = 4, 3
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, c, dtype=torch.long),
        completion_mask=torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]]),
        rewards=torch.zeros(n),
        group_size=2,
        max_new_tokens=c,
        temperature=1.0,
        engine_logprobs=torch.full((n, c), -1.0),
        token_weight_versions=torch.tensor([[5, 5, 5], [4, 5, -1], [3, 3, 3], [-1, -1, -1]]),
    )
    assert version_lag(batch, 5).tolist() == [[0, 0, 0], [1, 0, 0], [2, 2, 2], [0, 0, 0]]
    trainer = TokenLogProbs(torch.full((n, c), -1.0), None, torch.ones(n, c, dtype=torch.bool))
    metrics = mismatch_metrics(measure_mismatch(batch, trainer, 5, []))
    assert metrics["mismatch/tokens"] == 4 and metrics["mismatch/lagged/tokens"] == 5  # rows 0, 3 | 1, 2
    assert metrics["mismatch/version_lag_max"] == 2
    assert metrics["mismatch/version_lag_mean"] == pytest.approx((1 + 2 * 3) / 9)
    batch.engine_logprobs = None
    assert measure_mismatch(batch, trainer, 5, []) == {}


@pytest.mark.parametrize("several_corrections", [False, True])
def test_without_lags_the_empty_lagged_group_reads_as_if_computed(several_corrections):
    """lag=None skips the lagged group's arithmetic: every total equals the one computed over all-zero lags."""
    names = ["tis_token", "icepop"] if several_corrections else []
    for seed in range(60):
        trainer, engine, mask, _ = _case(seed)
        flags = (
            correction_flags([CORRECTIONS[n](CORRECTIONS.options(n)()) for n in names], trainer, engine, mask)
            if names
            else None
        )
        got = mismatch_sums(trainer, engine, mask, None, flags)
        want = mismatch_sums(trainer, engine, mask, torch.zeros(mask.shape, dtype=torch.long), flags)
        assert list(got) == list(want)
        assert all(
            a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(got.values(), want.values(), strict=True)
        )


def _padded_rollout(pad_value: float) -> RolloutBatch:
    """8 completions of 1-5 tokens; the engine's log-prob at every padding position is ``pad_value``."""
    g = torch.Generator().manual_seed(0)
    n, c = 8, 5
    mask = (torch.arange(c)[None] < torch.tensor([5, 3, 1, 4, 5, 2, 5, 3])[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.randint(3, 19, (n, 3), generator=g),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.randint(3, 19, (n, c), generator=g) * mask,
        completion_mask=mask,
        rewards=torch.rand(n, generator=g),
        group_size=4,
        max_new_tokens=c,
        temperature=1.0,
        engine_logprobs=torch.where(mask.bool(), -2.5 - torch.rand(n, c, generator=g), pad_value),
    )


def _one_step_metrics(rollout: RolloutBatch) -> tuple[dict[str, float], dict[str, float]]:
    """The module's and the health monitor's metrics of one real training step on ``rollout``."""
    torch.manual_seed(0)
    cfg = AlgorithmConfig(beta=0.0, micro_batch_size=4, corrections=["icepop", "geo_mask"])
    cfg.geo_mask = GeoMaskOptions(lower=0.5, upper=2.0)
    module = GRPOModule(build_tiny_policy(build_char_tokenizer()), cfg)
    health = HealthMonitor(HealthConfig())
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[health],
    )
    trainer.fit(module, train_dataloaders=DataLoader([rollout], batch_size=None, collate_fn=lambda batch: batch))
    return module.last_metrics, health.last_metrics


@pytest.mark.parametrize("pad_value", [-math.inf, math.nan])
def test_a_non_finite_engine_logprob_at_a_masked_position_changes_no_metric(pad_value):
    """Engines may write -inf (or NaN) where no token was sampled: through the step's real metric
    path (the first pass, measure_mismatch, mismatch_metrics, the F8 check) every mismatch/* and
    health/* metric stays finite and equals the one with a finite value there."""
    metrics, health = _one_step_metrics(_padded_rollout(pad_value))
    want, want_health = _one_step_metrics(_padded_rollout(-1.0))
    mismatch = {k: v for k, v in metrics.items() if k.startswith("mismatch/")}
    assert "mismatch/k1" in mismatch and "mismatch/outside_band/geo_mask" in mismatch
    assert all(math.isfinite(v) for v in mismatch.values()), mismatch
    assert all(math.isfinite(v) for v in health.values()), health
    assert mismatch == {k: v for k, v in want.items() if k.startswith("mismatch/")}
    assert health == want_health


@pytest.mark.parametrize("seed", range(20))
def test_lagged_tokens_split_by_their_own_lag_match_float64_formulas(seed):
    """Per-token lags (a pipelined sequence spans several versions): each bucket's k1, k3 and |d| are
    the float64 means over exactly its tokens; a bucket without tokens is not reported."""
    trainer, engine, mask, _ = _case(seed)
    g = torch.Generator().manual_seed(1000 + seed)
    lag = torch.randint(0, 5, mask.shape, generator=g)
    metrics = mismatch_metrics(mismatch_sums(trainer, engine, mask, lag))
    d = (trainer.double() - engine.double()).numpy()
    for low, high, name in ((1, 1, "1"), (2, 2, "2"), (3, 99, "3+")):
        on = mask.numpy() & (lag.numpy() >= low) & (lag.numpy() <= high)
        prefix = f"mismatch/by_lag/{name}/"
        if not on.any():
            assert prefix + "tokens" not in metrics
            continue
        x = d[on]
        assert metrics[prefix + "tokens"] == on.sum()
        assert metrics[prefix + "k1"] == pytest.approx(np.mean(-x), rel=1e-9, abs=1e-12)
        assert metrics[prefix + "k3"] == pytest.approx(np.mean(np.exp(x) - 1 - x), rel=1e-9, abs=1e-12)
        assert metrics[prefix + "abs_logp_diff_mean"] == pytest.approx(np.mean(np.abs(x)), rel=1e-9, abs=1e-12)
