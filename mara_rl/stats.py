"""Hierarchical paired bootstrap for differences between methods (docs/design.md §8, §9.1).

Every method runs on the same frozen episodes, so comparing a with b gives,
per task set, a matrix of paired differences D[s, e] = a(s, e) − b(s, e) over
training seeds s and episodes e (`difference_matrix`). Seeds and episodes are
two sources of variation and are resampled separately: one resample draws
|S| seeds with replacement and, independently, each task set's episodes with
replacement inside that task set, then averages D over drawn seeds × drawn
episodes, per task set first and then with equal weight over the task sets
(`hierarchical_bootstrap`). Cells (s, e) are never drawn one by one, which
would treat the seeds of one episode as independent.

The draw order is fixed: the episodes of each task set in turn, then the
seeds (not drawn when there is one). So with one seed and one task set the
interval is exactly the episode (cluster) bootstrap of `np.random.default_rng`
seeded with `BootstrapConfig.seed`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike


@dataclass(frozen=True)
class BootstrapConfig:
    resamples: int = 2000
    level: float = 0.95
    seed: int = 0  # fixed: the same inputs always give the same interval


@dataclass(frozen=True)
class PairedDifference:
    """Mean of a − b (equal weight per task set) and its percentile bootstrap interval."""

    mean: float
    low: float
    high: float
    seeds: int  # training seeds paired (1 when neither method is trained)
    episodes: int  # frozen episodes, summed over the task sets

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def difference_matrix(a: Mapping[int | None, ArrayLike], b: Mapping[int | None, ArrayLike]) -> np.ndarray:
    """D[s, e] = a(s, e) − b(s, e), seeds × episodes, for one task set.

    Keys are training seeds (None for a method that is not trained); values
    are per-episode success rates in frozen-episode order. An untrained
    method's values are used for every seed of the other; two trained
    methods are paired on the seeds they share (rows in increasing seed
    order); two untrained methods give one row.
    """
    trained = [set(x) for x in (a, b) if None not in x]
    seeds = sorted(set.intersection(*trained)) if trained else [None]
    if not seeds:
        raise ValueError(f"no shared scheduler seeds to pair: {sorted(a)} vs {sorted(b)}")
    rows_a = [np.asarray(a[None] if None in a else a[s], float) for s in seeds]
    rows_b = [np.asarray(b[None] if None in b else b[s], float) for s in seeds]
    shapes = {x.shape for x in rows_a + rows_b}
    if len(shapes) != 1 or len(next(iter(shapes))) != 1 or rows_a[0].size == 0:
        raise ValueError(f"unpaired episodes: per-episode arrays of shapes {sorted(shapes)}")
    return np.stack(rows_a) - np.stack(rows_b)


def _draw_counts(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """How often each of n items is drawn in each resample of n draws with replacement (resamples × n)."""
    picks = rng.integers(0, n, size=(resamples, n)) + n * np.arange(resamples)[:, None]
    return np.bincount(picks.ravel(), minlength=resamples * n).reshape(resamples, n)


def hierarchical_bootstrap(diffs: ArrayLike | Sequence[ArrayLike],
                           cfg: BootstrapConfig = BootstrapConfig()) -> PairedDifference:
    """Percentile interval of the mean paired difference, resampling seeds and episodes apart.

    `diffs`: one seeds × episodes matrix D per task set (a single 2-d array
    is one task set), the same seeds in the same row order in each; task
    sets may hold different numbers of episodes and weigh equally all the
    same. A method against itself (D = 0) gives exactly [0, 0].
    """
    if isinstance(diffs, np.ndarray) and diffs.ndim == 2:
        diffs = [diffs]
    mats = [np.asarray(d, float) for d in diffs]
    if not mats or any(d.ndim != 2 or 0 in d.shape for d in mats):
        raise ValueError("hierarchical_bootstrap needs one non-empty seeds × episodes matrix per task set")
    n_seeds = mats[0].shape[0]
    if any(d.shape[0] != n_seeds for d in mats):
        raise ValueError(f"task sets pair different numbers of seeds: {[d.shape[0] for d in mats]}")
    rng = np.random.default_rng(cfg.seed)
    episode_counts = [_draw_counts(rng, d.shape[1], cfg.resamples) for d in mats]
    seed_counts = _draw_counts(rng, n_seeds, cfg.resamples) if n_seeds > 1 \
        else np.ones((cfg.resamples, 1), np.int64)
    # Per resample and task set: Σ_s Σ_e (times s was drawn)(times e was drawn) D[s, e] / (|S| |E|),
    # the mean of D over the drawn seeds × the drawn episodes.
    per_set = [((seed_counts @ d) * counts).sum(axis=1) / (n_seeds * d.shape[1])
               for d, counts in zip(mats, episode_counts, strict=True)]
    means = np.mean(per_set, axis=0)
    tail = 100 * (1 - cfg.level) / 2
    low, high = np.percentile(means, [tail, 100 - tail])
    return PairedDifference(float(np.mean([d.mean() for d in mats])), float(low), float(high),
                            n_seeds, sum(d.shape[1] for d in mats))


def mean_std(values: np.ndarray) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value), e.g. over seed × root."""
    values = np.asarray(values, float).ravel()
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0
