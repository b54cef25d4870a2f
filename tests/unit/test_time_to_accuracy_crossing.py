"""The threshold rule of benchmarks/time_to_accuracy.py: the first step whose full moving window reaches it."""

import importlib.util
import random
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "time_to_accuracy.py"
spec = importlib.util.spec_from_file_location("time_to_accuracy", PATH)
tta = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tta)


def brute_force(values, threshold, window):
    for i in range(window - 1, len(values)):
        if sum(values[i - window + 1 : i + 1]) / window >= threshold - 1e-12:
            return i
    return None


def test_needs_a_full_window_and_returns_the_first_crossing():
    assert tta.first_crossing([1.0, 1.0], 0.5, 3) is None  # high values, but no full window yet
    assert tta.first_crossing([0.0, 1.0, 1.0, 0.0], 0.5, 2) == 1
    assert tta.first_crossing([0.2, 0.4, 0.6, 0.8], 0.5, 2) == 2  # (0.4 + 0.6) / 2 = 0.5 counts
    assert tta.first_crossing([], 0.5, 1) is None
    with pytest.raises(ValueError):
        tta.first_crossing([1.0], 0.5, 0)


def test_matches_a_brute_force_window_mean_on_random_curves():
    rng = random.Random(0)
    for _ in range(500):
        values = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(rng.randint(0, 40))]
        threshold, window = rng.choice([0.25, 0.5, 0.7]), rng.randint(1, 8)
        assert tta.first_crossing(values, threshold, window) == brute_force(values, threshold, window)


def test_an_unreached_threshold_counts_as_slower_than_any_reached_one():
    assert tta.median_of([10.0, None, 30.0], unreached_is_infinite=True) == 30.0
    assert tta.median_of([10.0, None, None], unreached_is_infinite=True) is None  # the median run never got there
    assert tta.median_of([10.0, None, 30.0], unreached_is_infinite=False) == 20.0  # rates: missing ones left out
    assert tta.median_of([], unreached_is_infinite=True) is None
