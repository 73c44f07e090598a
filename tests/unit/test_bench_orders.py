"""The serving benchmarks' statistics: the balanced orders their paths run in and the interval
of a median of paired differences (what their verdicts rest on)."""

from __future__ import annotations

import itertools
import random
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_serving import balanced_orders
from bench_serving_compare import median_ci


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_each_path_runs_right_after_each_other_equally_often(count: int) -> None:
    orders = balanced_orders(count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    follows = Counter((a, b) for order in orders for a, b in itertools.pairwise(order))
    assert set(follows) == {(a, b) for a in range(count) for b in range(count) if a != b}
    assert len(set(follows.values())) == 1
    # ... and each path takes each position equally often.
    positions = Counter((path, position) for order in orders for position, path in enumerate(order))
    assert len(positions) == count * count and len(set(positions.values())) == 1


def test_the_median_interval_covers_the_true_median_about_95_percent_of_the_time() -> None:
    rng = random.Random(7)
    covered = 0
    for _ in range(400):
        sample = [rng.gauss(0.3, 1.0) for _ in range(60)]
        low, high = median_ci(sample)
        assert low <= sorted(sample)[30] <= high
        covered += low <= 0.3 <= high
    assert 0.92 <= covered / 400 <= 0.99


def test_too_few_pairs_for_an_interval_is_an_error() -> None:
    with pytest.raises(ValueError, match="too few"):
        median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
