"""evaluation/bootstrap.py: intervals that cover the true mean at their stated rate, paired differences, seeds."""

import numpy as np
import pytest

from evaluation import bootstrap

MU, BLOCKS, SIZE = 5.0, 40, 64


def correlated_nll(rng, blocks: int = BLOCKS, size: int = SIZE) -> np.ndarray:
    """Token NLLs with true mean MU whose tokens share their block's offset (a scene that is easy or hard), as
    real text does: tokens within a block are correlated, blocks are independent."""
    offset = rng.normal(0, 0.5, blocks).repeat(size)
    return MU + offset + rng.normal(0, 1.0, blocks * size)


def coverage(unit_size: int, reps: int = 300) -> float:
    hits = 0
    for rep in range(reps):
        nll = correlated_nll(np.random.default_rng(rep))
        sums, counts = bootstrap.contiguous_blocks(nll, unit_size)
        lo, hi = bootstrap.interval(bootstrap.resample(sums, counts, bootstrap.block_draws(len(sums), rep, 1000)))
        hits += lo <= MU <= hi
    return hits / reps


def test_block_interval_covers_the_true_mean_at_its_stated_rate():
    """Over 300 seeded data sets, the 95% interval over blocks holds the true mean about 95% of the time (a
    percentile bootstrap over 40 blocks runs a little under: 0.90..0.98 allows that and 3 standard errors)."""
    assert 0.90 <= coverage(SIZE) <= 0.98


def test_a_token_bootstrap_would_be_far_too_narrow():
    """Why blocks: resampling single tokens ignores their correlation and misses the true mean most of the time."""
    assert coverage(1, reps=100) < 0.6


def test_same_key_same_draws_and_token_weighting():
    a, b = bootstrap.block_draws(7, ["x", 1]), bootstrap.block_draws(7, ["x", 1])
    assert np.array_equal(a, b) and not np.array_equal(a, bootstrap.block_draws(7, ["x", 2]))
    idx = np.array([[0, 0, 1]])  # block 0 twice, block 1 once: (2 * 10 + 30) / (2 * 2 + 3) tokens
    assert bootstrap.resample(np.array([10.0, 30.0]), np.array([2, 3]), idx)[0] == pytest.approx(50 / 7)


def test_paired_difference_sees_what_unpaired_intervals_cannot():
    """Two schemes scored on the same blocks, the second better by 0.02 nats everywhere: the blocks vary far more
    than that, so their own intervals overlap, but the paired difference (same draws) excludes 0 and covers the
    true difference; an identical pair is within noise."""
    rng = np.random.default_rng(0)
    a = correlated_nll(rng)
    b = a - 0.02 + rng.normal(0, 0.05, a.size)
    draws = bootstrap.block_draws(BLOCKS, "pair")
    sa, counts = bootstrap.contiguous_blocks(a, SIZE)
    sb, _ = bootstrap.contiguous_blocks(b, SIZE)
    da, db = bootstrap.resample(sa, counts, draws), bootstrap.resample(sb, counts, draws)
    lo_a, _ = bootstrap.interval(da)
    _, hi_b = bootstrap.interval(db)
    assert hi_b > lo_a  # the intervals overlap
    diff = bootstrap.difference(db, da)
    assert not diff["within_noise"] and diff["lo"] <= -0.02 <= diff["hi"]
    assert bootstrap.difference(da, da.copy())["within_noise"]


def test_seed_groups_widen_the_interval_by_the_spread_of_runs():
    """Runs of one group that differ by a constant (the seed): resampling the runs as well as the blocks gives
    an interval at least as wide as the blocks alone, and centred on the mean of the runs."""
    rng = np.random.default_rng(1)
    base = correlated_nll(rng)
    sums, counts = bootstrap.contiguous_blocks(base, SIZE)
    runs = np.stack([sums + shift * counts for shift in (-0.3, 0.0, 0.3)])
    draws = bootstrap.block_draws(BLOCKS, "seeds")
    one = bootstrap.interval(bootstrap.resample(sums, counts, draws))
    group = bootstrap.resample(runs, counts, draws, run_key="g")
    lo, hi = bootstrap.interval(group)
    assert hi - lo > (one[1] - one[0]) * 1.2
    assert np.mean(group) == pytest.approx(sums.sum() / counts.sum(), abs=0.05)
