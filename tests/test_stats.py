"""The hierarchical paired bootstrap (docs/design.md §9.1) on hand-made difference matrices."""

from __future__ import annotations

import numpy as np
import pytest

from mara_rl.stats import (
    BootstrapConfig,
    PairedDifference,
    difference_matrix,
    hierarchical_bootstrap,
    mean_std,
)

CFG = BootstrapConfig()


def width(d: PairedDifference) -> float:
    return d.high - d.low


def episode_bootstrap(per_set: list[np.ndarray], cfg: BootstrapConfig = CFG) -> tuple[float, float]:
    """The plain cluster bootstrap over episodes, written out independently: each task set's
    episodes drawn with replacement in turn from one generator, then the task sets' means averaged."""
    rng = np.random.default_rng(cfg.seed)
    means = np.mean([x[rng.integers(0, len(x), size=(cfg.resamples, len(x)))].mean(axis=1) for x in per_set],
                    axis=0)
    tail = 100 * (1 - cfg.level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def test_a_method_against_itself_is_exactly_zero() -> None:
    rng = np.random.default_rng(1)
    a = [{0: rng.random(20), 1: rng.random(20), 2: rng.random(20)} for _ in range(3)]
    same = hierarchical_bootstrap([difference_matrix(x, x) for x in a])
    assert (same.mean, same.low, same.high, same.excludes_zero) == (0.0, 0.0, 0.0, False)
    assert (same.seeds, same.episodes) == (3, 60)


def test_seeds_that_disagree_widen_the_interval() -> None:
    episodes = np.random.default_rng(2).random(30)
    agree = np.tile(episodes, (3, 1))
    disagree = agree + np.array([[-0.1], [0.0], [0.1]])  # a seed offset; the same mean
    one_seed = hierarchical_bootstrap(episodes[None, :])
    same_seeds, offset = hierarchical_bootstrap(agree), hierarchical_bootstrap(disagree)
    assert offset.mean == pytest.approx(same_seeds.mean)
    # Seeds that agree add nothing: the episode-only interval, to the last bits.
    assert (same_seeds.low, same_seeds.high) == pytest.approx((one_seed.low, one_seed.high), abs=1e-12)
    assert width(offset) > 1.2 * width(same_seeds)
    # Cells drawn one by one would treat the three copies of an episode as independent: narrower.
    rng = np.random.default_rng(0)
    cells = disagree.ravel()[rng.integers(0, disagree.size, size=(CFG.resamples, disagree.size))].mean(axis=1)
    assert width(offset) > np.ptp(np.percentile(cells, [2.5, 97.5]))


def test_one_seed_is_the_episode_bootstrap() -> None:
    x = np.random.default_rng(4).normal(0.05, 0.2, 25)
    got = hierarchical_bootstrap(x[None, :])
    assert (got.low, got.high) == pytest.approx(episode_bootstrap([x]), abs=1e-12)
    assert got.mean == pytest.approx(x.mean()) and (got.seeds, got.episodes) == (1, 25)
    # An untrained method against another untrained one: a single row.
    assert difference_matrix({None: x}, {None: np.zeros(25)}).shape == (1, 25)


def test_the_same_seed_gives_the_same_interval() -> None:
    d = np.random.default_rng(5).normal(0.0, 0.3, (3, 16))
    first, again = hierarchical_bootstrap(d), hierarchical_bootstrap(d.copy())
    assert first == again
    other = hierarchical_bootstrap(d, BootstrapConfig(seed=1))
    assert (other.low, other.high) != (first.low, first.high)


def test_the_mean_column_weighs_task_sets_equally() -> None:
    """Episodes are resampled inside their task set: a set's share never changes."""
    big, small = np.ones((2, 40)), -np.ones((2, 5))
    both = hierarchical_bootstrap([big, small])
    assert both.mean == 0.0 and both.episodes == 45
    assert both.low == pytest.approx(0.0, abs=1e-12) and both.high == pytest.approx(0.0, abs=1e-12)
    # Pooled into one set, the 40 episodes would outweigh the 5.
    assert hierarchical_bootstrap(np.hstack([big, small])).mean == pytest.approx(35 / 45)


def test_with_one_seed_the_mean_column_is_the_stratified_episode_bootstrap() -> None:
    rng = np.random.default_rng(6)
    per_set = [rng.normal(0.1, 0.2, n) for n in (8, 20, 3)]
    got = hierarchical_bootstrap([x[None, :] for x in per_set])
    assert got.mean == pytest.approx(np.mean([x.mean() for x in per_set]))
    assert (got.low, got.high) == pytest.approx(episode_bootstrap(per_set), abs=1e-12)


def test_seeds_are_drawn_once_for_every_task_set() -> None:
    """A seed is one trained policy across task sets: its offset moves every set together."""
    rng = np.random.default_rng(7)
    offsets = np.array([[-0.2], [0.2]])
    sets = [np.zeros((2, 30)) + offsets + 0.01 * rng.standard_normal((2, 30)) for _ in range(3)]
    shared = hierarchical_bootstrap(sets)
    # Were seeds drawn per task set, the three offsets would partly cancel; shared, they do not.
    assert width(shared) > 0.3


def test_difference_matrix_pairs_seeds() -> None:
    a0, a1, b = np.array([1.0, 0.0]), np.array([0.5, 0.5]), np.array([0.25, 0.75])
    assert np.array_equal(difference_matrix({0: a0, 1: a1}, {None: b}), [a0 - b, a1 - b])
    assert np.array_equal(difference_matrix({None: b}, {1: a1, 0: a0}), [b - a0, b - a1])  # seed order
    assert np.array_equal(difference_matrix({0: a0, 1: a1}, {1: b, 2: b}), [a1 - b])  # shared seed 1 only
    with pytest.raises(ValueError, match="no shared scheduler seeds"):
        difference_matrix({0: a0}, {1: b})
    with pytest.raises(ValueError, match="unpaired episodes"):
        difference_matrix({None: a0}, {None: np.zeros(3)})


def test_malformed_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="different numbers of seeds"):
        hierarchical_bootstrap([np.zeros((2, 4)), np.zeros((3, 4))])
    for bad in ([], [np.zeros((2, 0))], [np.zeros(4)]):
        with pytest.raises(ValueError, match="non-empty seeds × episodes"):
            hierarchical_bootstrap(bad)


def test_mean_std() -> None:
    assert mean_std(np.array([1.0, 3.0])) == (2.0, pytest.approx(np.sqrt(2)))
    assert mean_std(np.array([[0.5]])) == (0.5, 0.0)
