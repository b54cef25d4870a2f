"""The gradient of 2 ranks x B equals that of 1 rank x 2B, for every aggregation mode: the
loss normalizer is reduced over ranks before the first backward and the loss is scaled by
world_size against DDP's (and FSDP2's) gradient averaging (2 real gloo processes on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.ddp_gradients_worker import fixed_batch

from grpo_lightning.algorithm import LOSS_AGG_MODES

WORKER = Path(__file__).resolve().parents[1] / "helpers" / "ddp_gradients_worker.py"


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> Path:
    """One 2-process launch compares DDP's and FSDP2's gradients (trainer.strategy=fsdp)."""
    out = tmp_path_factory.mktemp("grads")
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out), "ddp", "fsdp"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(params=["ddp", "fsdp"])
def results(request, compared):
    """Per loss mode, the worker's comparison for one strategy."""
    return {mode: json.loads((compared / request.param / f"{mode}.json").read_text()) for mode in LOSS_AGG_MODES}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_two_ranks_of_b_equal_one_rank_of_2b(results, mode):
    r = results[mode]
    assert r["grad_norm"] > 1e-3  # a real gradient, not two zeros agreeing
    assert r["max_abs_diff"] <= 1e-6 * max(1.0, r["grad_norm"]), r
    # the normalizer each rank used is the whole batch's, reduced over both ranks
    tokens = float(fixed_batch().completion_mask.sum())
    expected = {
        "token_mean": tokens,
        "seq_mean_token_mean": 16,
        "seq_mean_token_sum": 16,
        "seq_mean_token_sum_norm": 16 * 6,
    }
    assert r["normalizer"] == expected[mode]
    assert r["aggregation"]["policy"] == r["aggregation"]["kl"] == [mode, r["normalizer"]]


def test_auto_micro_batches_are_the_same_on_ranks_whose_rollouts_differ_in_width(compared):
    """auto reads the width; under FSDP every micro-batch is collectives, so each rank must run as many:
    both take the widest rank's size (rank 1's 100 tokens: 32 rows), not their own."""
    ranks = [json.loads((compared / f"auto_rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["used_width"] for r in ranks] == [16, 100]
    assert ranks[0]["sizes"] == ranks[1]["sizes"] == [32, 32]  # alone, rank 0 would take its 64 rows at once
