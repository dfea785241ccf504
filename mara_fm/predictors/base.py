"""The predictor interface shared by FM, WLS and the oracle (docs/design.md §5).

A predictor answers, for a batch of tasks at once: how many more batches
does each task need before its cumulative-average loss reaches ε? Answers are
capped at the horizon; a task not yet past warm-up gets the horizon.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from mara_fm.bank import CurveSet

WARMUP_POINTS = 4


@dataclass(frozen=True)
class HistoryBatch:
    """Observed prefixes of B tasks.

    `avg[b, i]` is the cumulative-average loss after i+1 batches for
    i < lengths[b] and NaN beyond; point i sits at s = (i+1)·batch_size[b]
    samples. `future` holds the whole true curve and is read by the oracle
    only; learned predictors never see it. `kind` names each task's job kind,
    which only the history predictor reads (a cluster that knows its jobs).
    """

    avg: np.ndarray  # (B, L) float64, NaN-padded
    lengths: np.ndarray  # (B,) int64, >= 1
    batch_size: np.ndarray  # (B,) int64
    lr: np.ndarray  # (B,) float64
    future: np.ndarray | None = None  # (B, cap) true cumulative averages
    kind: np.ndarray | None = None  # (B,) each task's job kind (its family); read by the history predictor only

    def __len__(self) -> int:
        return len(self.lengths)

    def log_prefix(self) -> np.ndarray:
        """log L of the observed points, 0 beyond each prefix."""
        observed = np.arange(self.avg.shape[1]) < self.lengths[:, None]
        return np.log(np.where(observed, self.avg, 1.0))

    @property
    def current(self) -> np.ndarray:
        """The latest observed cumulative-average loss of each task."""
        return self.avg[np.arange(len(self)), self.lengths - 1]

    @staticmethod
    def from_curves(curves: np.ndarray, lengths: np.ndarray, batch_size: np.ndarray,
                    lr: np.ndarray) -> HistoryBatch:
        """Prefixes of full true curves (B, cap); `future` keeps the curves."""
        lengths = np.asarray(lengths, dtype=np.int64)
        width = int(lengths.max())
        visible = np.arange(width)[None, :] < lengths[:, None]
        avg = np.where(visible, curves[:, :width], np.nan)
        return HistoryBatch(avg, lengths, np.asarray(batch_size, np.int64),
                            np.asarray(lr, np.float64), curves)


class Predictor(ABC):
    """Estimates remaining batches to a threshold from an observed prefix."""

    name: str = "predictor"
    uses_warmup: bool = True

    def remaining_batches(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray,
                          optimistic: float | None = None) -> np.ndarray:
        """Remaining batches to reach `eps`, in [0, horizon] (horizon in batches).

        Tasks already at or below `eps` need 0; tasks with fewer than
        `WARMUP_POINTS` observations get the horizon (warm-up rule). With
        `optimistic` = q the answer is (B, 2): the estimate, and the q-quantile
        of the predictor's own uncertainty about it (`_predict_band`), `inf`
        where that quantile does not reach `eps` within the horizon.
        """
        eps, horizon = _per_task(eps, len(hist)), _per_task(horizon, len(hist))
        current = hist.current
        ready = current > eps
        if self.uses_warmup:
            ready &= hist.lengths >= WARMUP_POINTS

        def predict(h: HistoryBatch, e: np.ndarray, hz: np.ndarray) -> np.ndarray:
            return self._predict(h, e, hz) if optimistic is None else self._predict_band(h, e, hz, optimistic)

        if ready.all() and len(hist):
            raw = predict(hist, eps, horizon)
        else:
            raw = horizon.copy() if optimistic is None else np.stack([horizon, horizon], axis=1)
            if ready.any():
                raw[ready] = predict(take(hist, ready), eps[ready], horizon[ready])
        return self._settle(raw, current, hist.lengths, eps, horizon)

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray,
                         eps: np.ndarray, horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        """`remaining_batches` for the first lengths[b] points of curve rows[b] of `source`.

        This is what a simulator replaying a bank asks at every step; a
        predictor whose answer depends only on the prefix may override it with
        work precomputed once per curve set (WLS does).
        """
        hist = HistoryBatch.from_curves(source.avg[rows], lengths, source.batch_size[rows], source.lr[rows])
        return self.remaining_batches(hist, eps, horizon, optimistic)

    def _settle(self, raw: np.ndarray, current: np.ndarray, lengths: np.ndarray,
                eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        """Clip raw estimates (B,) or (B, 2) to [0, horizon]; 0 once at ε, the horizon during warm-up.

        In a band's optimistic column a task that does not reach ε within the horizon
        gets `inf`, not the horizon: the horizon is the rest of its generation cap, so
        it can never succeed. (docs/design.md's estimate reports the horizon, which reads as a
        task that just makes it when its deadline is at the cap.)
        """
        if raw.ndim == 2:
            current, lengths, eps, horizon = (a[:, None] for a in (current, lengths, eps, horizon))
        out = np.minimum(np.maximum(raw, 0.0), horizon)
        if raw.ndim == 2:
            out[:, 1] = np.where(raw[:, 1] >= horizon[:, 0], np.inf, out[:, 1])
        if self.uses_warmup:
            out = np.where(lengths < WARMUP_POINTS, horizon, out)
        return np.where(current <= eps, 0.0, out)

    def _predict_band(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray,
                      quantile: float) -> np.ndarray:
        """(B, 2): the raw estimate and its optimistic `quantile`. A point predictor
        (WLS, the oracle) has no spread and repeats its estimate."""
        estimate = self._predict(hist, eps, horizon)
        return np.stack([estimate, estimate], axis=1)

    @abstractmethod
    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        """Raw estimates for tasks past warm-up and still above `eps`."""


def _per_task(value: np.ndarray | float, n: int) -> np.ndarray:
    value = np.asarray(value, np.float64)
    return np.full(n, value) if value.ndim == 0 else value


def take(hist: HistoryBatch, mask: np.ndarray) -> HistoryBatch:
    """The tasks of `hist` where `mask` holds."""
    return HistoryBatch(
        hist.avg[mask], hist.lengths[mask], hist.batch_size[mask], hist.lr[mask],
        None if hist.future is None else hist.future[mask],
        None if hist.kind is None else hist.kind[mask],
    )
