"""History: remaining demand read off earlier finished runs of the same job kind (docs/design.md §5.5).

A cluster usually knows what kind of job a task is and keeps the loss curves
of earlier runs of that kind; FM sees neither. This predictor answers from
them: the k finished runs of the task's kind whose log loss over its
observed points (or the last `window` of them) lies closest to the task's,
each shifted to the task's current level. The estimate is the median of their crossings of ε,
the optimistic answer their q-quantile (a run that never gets there counts
as never), the same band as FM's.

It changes the problem (it needs each task's kind and a store of finished
runs), so it is a predictor of its own with methods of their own, never the
paper's setting. Its pool is a bank file of fresh runs (`[history_bank]`,
another seed root than the main bank's), so it holds no curve the evaluation
scores.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from mara_fm.bank import CurveSet, curve_set, load_bank
from mara_fm.predictors.base import HistoryBatch, Predictor
from mara_fm.predictors.oracle import first_crossing

T = TypeVar("T")

# Chosen on ID validation episodes (experiments/probes/history_probe.py; docs/decisions.md, "Predictor").
NEIGHBOURS = 10
WINDOW: int | None = None  # None: the whole observed prefix


@functools.lru_cache(maxsize=4)
def _pool(path: str, mtime: float) -> CurveSet:
    return curve_set(load_bank(path))


def history_pool(path: str | Path) -> CurveSet:
    """Every run of a history bank file (cached per file version)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: history bank not found (build it with `mara curves --history`)")
    return _pool(str(path), path.stat().st_mtime)


class HistoryPredictor(Predictor):
    """Remaining batches from the nearest finished runs of the task's own job kind."""

    name = "history"

    def __init__(self, pool: CurveSet, neighbours: int = NEIGHBOURS, window: int | None = WINDOW) -> None:
        if neighbours < 1 or (window is not None and window < 1):
            raise ValueError(f"history predictor: neighbours and window must be ≥ 1, got {neighbours}, {window}")
        self.pool, self.neighbours, self.window = pool, neighbours, window
        # Each kind's log curves, taken out of the pool once rather than at every query.
        self.runs = {kind: pool.log_avg[pool.families == kind] for kind in pool.family_names()}

    @classmethod
    def load(cls, path: str | Path, **settings: int | None) -> HistoryPredictor:
        return cls(history_pool(path), **settings)

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        """The simulator's question, with each task's kind (its curve's family) attached."""
        hist = HistoryBatch.from_curves(source.avg[rows], lengths, source.batch_size[rows], source.lr[rows])
        hist = dataclasses.replace(hist, future=None, kind=source.families[rows])
        return self.remaining_batches(hist, eps, horizon, optimistic)

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        return self._bands(hist, eps, None)[:, 0]

    def _predict_band(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray,
                      quantile: float) -> np.ndarray:
        return self._bands(hist, eps, quantile)

    @property
    def samples(self) -> int:
        """M of `sorted_crossings`: the neighbours, fewer if some kind has fewer runs in the pool."""
        return min(self.neighbours, *(len(runs) for runs in self.runs.values()))

    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        """(B, M) the remaining batches of each task's M nearest runs, ascending (inf: never):
        the spread the estimate comes from, scored like FM's samples (eval_predictor.py)."""
        return np.stack(self._per_task(hist, eps, lambda *task: self._crossings(*task, self.samples)))

    def _bands(self, hist: HistoryBatch, eps: np.ndarray, quantile: float | None) -> np.ndarray:
        """(B, 2): the median of the neighbours' remaining batches and their `quantile` (the
        median again without one)."""
        return np.array(self._per_task(hist, eps, lambda *task: self._band(*task, quantile)))

    def _per_task(self, hist: HistoryBatch, eps: np.ndarray, answer: Callable[[str, np.ndarray, float], T]
                  ) -> list[T]:
        """`answer(kind, log prefix, ε)` of each task."""
        if hist.kind is None:
            raise ValueError("the history predictor needs each task's job kind (HistoryBatch.kind)")
        logs = hist.log_prefix()
        return [answer(str(kind), logs[b, :n], float(e))
                for b, (kind, n, e) in enumerate(zip(hist.kind, hist.lengths, eps, strict=True))]

    def _band(self, kind: str, mine: np.ndarray, eps: float, quantile: float | None) -> tuple[float, float]:
        crossing = self._crossings(kind, mine, eps, self.neighbours)
        median = float(np.median(crossing))
        return median, median if quantile is None else float(crossing[round(quantile * (len(crossing) - 1))])

    def _crossings(self, kind: str, mine: np.ndarray, eps: float, count: int) -> np.ndarray:
        """The remaining batches to ε of the `count` runs of `kind` nearest to the task, each moved
        to its current level, ascending."""
        near, shift, _ = self.nearest(kind, mine, count)
        shifted = np.exp(self.runs[kind][near] + shift[:, None])
        k, n = len(near), len(mine)
        return np.sort(first_crossing(shifted, np.full(k, n), np.full(k, eps), np.full(k, np.inf)))

    def nearest(self, kind: str, mine: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The `count` runs of `kind` whose log curve over the task's observed points (the last
        `window` of them), moved to the task's current level, lies closest to the task's log
        prefix `mine`: their rows in `runs[kind]`, nearest first, the log shift that moved each
        and its mean squared log distance."""
        theirs = self.runs.get(kind)
        if theirs is None:
            raise ValueError(f"no finished run of job kind {kind!r} in the history pool "
                             f"(it has {sorted(self.runs)})")
        n = len(mine)
        if n > self.pool.cap:
            raise ValueError(f"a prefix of {n} points is longer than the history pool's runs ({self.pool.cap})")
        start = 0 if self.window is None else max(0, n - self.window)
        shift = mine[-1] - theirs[:, n - 1]  # each run moved to the task's current level
        distance = np.mean((theirs[:, start:n] + shift[:, None] - mine[start:]) ** 2, axis=1)
        near = np.argsort(distance, kind="stable")[:count]
        return near, shift[near], distance[near]
