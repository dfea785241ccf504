"""Paired bootstrap intervals for differences between methods (docs/design.md §8).

Every method runs on the same frozen episodes, so a difference is measured
per shared *unit* (one frozen episode × one scheduler training seed) and the
units are resampled together: the episode-to-episode spread, which is large
and common to all methods, cancels out of the paired difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BootstrapConfig:
    resamples: int = 2000
    level: float = 0.95
    seed: int = 0  # fixed: the same inputs always give the same interval


@dataclass(frozen=True)
class PairedDifference:
    """Mean of a − b over the shared units and its percentile bootstrap interval."""

    mean: float
    low: float
    high: float
    units: int

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def align_seeds(a: dict[int | None, np.ndarray],
                b: dict[int | None, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit values of two methods, flattened in (seed, episode) order.

    Keys are training seeds (None for a method that is not trained); values
    are per-episode success rates in frozen-episode order. A method without
    seeds is repeated across the other's seeds; two trained methods are
    paired on the seeds they share.
    """
    trained = [set(x) for x in (a, b) if None not in x]
    seeds = sorted(set.intersection(*trained)) if trained else [None]
    if not seeds:
        raise ValueError(f"no shared scheduler seeds to pair: {sorted(a)} vs {sorted(b)}")
    pick_a = [a.get(None, a.get(s)) for s in seeds]
    pick_b = [b.get(None, b.get(s)) for s in seeds]
    for x, y in zip(pick_a, pick_b, strict=True):
        if len(x) != len(y):
            raise ValueError(f"unpaired units: {len(x)} vs {len(y)} episodes")
    return np.concatenate(pick_a), np.concatenate(pick_b)


def paired_bootstrap(a: np.ndarray, b: np.ndarray,
                     cfg: BootstrapConfig = BootstrapConfig()) -> PairedDifference:
    """Percentile bootstrap over units of mean(a − b); a method against itself gives [0, 0]."""
    diff = np.asarray(a, float) - np.asarray(b, float)
    if diff.ndim != 1 or len(diff) == 0:
        raise ValueError("paired_bootstrap needs two equally long, non-empty 1-d arrays")
    rng = np.random.default_rng(cfg.seed)
    means = diff[rng.integers(0, len(diff), size=(cfg.resamples, len(diff)))].mean(axis=1)
    tail = 100 * (1 - cfg.level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDifference(float(diff.mean()), float(low), float(high), len(diff))


def mean_std(values: np.ndarray) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value), e.g. over seed × root."""
    values = np.asarray(values, float).ravel()
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0
