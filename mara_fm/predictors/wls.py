"""WLS: the power-law extrapolation used by LARA (docs/design.md §5.2)."""

from __future__ import annotations

import numpy as np

from mara_fm.bank import CurveSet
from mara_fm.predictors.base import HistoryBatch, Predictor


class WLSPredictor(Predictor):
    """Fit log L = α − b·log s with forgetting weights γ^(n−i); solve for ε.

    Recent points weigh more, so the fit follows the current slope of the
    curve; a non-decreasing fit (b ≤ 0) never crosses and returns the horizon.

    The fit depends only on the observed prefix, so when a simulator replays
    a curve set (`replay_remaining`) the fits of every prefix of every curve
    are computed once and then looked up.
    """

    name = "wls"

    def __init__(self, gamma: float = 0.9, ridge: float = 1e-6) -> None:
        if not 0 < gamma <= 1:
            raise ValueError(f"WLS forgetting factor gamma={gamma} must be in (0, 1]")
        self.gamma = gamma
        self.ridge = ridge
        self._grow(512)  # history length; grown on demand
        self._source_fits: dict[tuple[int, int], tuple[CurveSet, np.ndarray, np.ndarray]] = {}

    def _grow(self, length: int) -> None:
        """Tables that make a refit cost two mat-vec products per batch of tasks.

        With x_i = log i + log B, every weighted moment splits into a part that
        depends only on n (prefix sums of γ^(n−i)·(log i)^p, tabulated here) and
        the data terms Σ γ^(n−i)·y_i·(log i)^p = γ^n · Σ γ^(−i)·y_i·(log i)^p.
        """
        i = np.arange(1, length + 1)
        log_i = np.log(i)
        self._log_i = log_i
        self._inv_powers = np.stack([self.gamma ** -i, self.gamma ** -i * log_i], axis=1)  # (L, 2)
        self._powers = self.gamma ** np.arange(length + 1)
        tables = np.zeros((3, length + 1))
        for n in range(1, length + 1):
            tables[:, n] = self.gamma * tables[:, n - 1] + log_i[n - 1] ** np.arange(3)
        self._tables = tables  # [Σγ^(n−i), Σγ^(n−i)·log i, Σγ^(n−i)·log² i] by n

    def _fit(self, n: np.ndarray, batch_size: np.ndarray, sy: np.ndarray,
             sy_log_i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(α, b) from the data moments Σw·y and Σw·y·log i of prefixes of length n."""
        t0, t1, t2 = self._tables[:, n]
        log_b = np.log(batch_size.astype(np.float64))
        sw = t0 + self.ridge
        sx = t1 + log_b * t0
        sxx = t2 + 2 * log_b * t1 + log_b**2 * t0 + self.ridge
        sxy = sy_log_i + log_b * sy
        slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
        return (sy - slope * sx) / sw, -slope

    def _fits_of(self, source: CurveSet) -> tuple[np.ndarray, np.ndarray]:
        """(α, b) of every prefix of every curve of `source`, shape (C, cap); index n−1."""
        key = (id(source), source.revision)
        entry = self._source_fits.get(key)
        if entry is None or entry[0] is not source:
            cap = source.cap
            if cap + 1 > len(self._powers):
                self._grow(2 * cap)
            y, log_i = source.log_avg, self._log_i[:cap]
            sy, sy_log_i = np.zeros((len(source), cap)), np.zeros((len(source), cap))
            sy[:, 0], sy_log_i[:, 0] = y[:, 0], 0.0
            for i in range(1, cap):  # the forgetting recursion, exact at any length
                sy[:, i] = self.gamma * sy[:, i - 1] + y[:, i]
                sy_log_i[:, i] = self.gamma * sy_log_i[:, i - 1] + y[:, i] * log_i[i]
            n = np.broadcast_to(np.arange(1, cap + 1), (len(source), cap))
            alpha, b = self._fit(n, source.batch_size[:, None], sy, sy_log_i)
            if len(self._source_fits) >= 8:
                self._source_fits.clear()
            entry = self._source_fits[key] = (source, alpha, b)
        return entry[1], entry[2]

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        n = hist.lengths
        width = hist.avg.shape[1]
        if width + 1 > len(self._powers):
            self._grow(2 * width)
        y = hist.log_prefix()  # 0 beyond the prefix, so those points add nothing
        data = (y @ self._inv_powers[:width]) * self._powers[n][:, None]  # Σw·y, Σw·y·log i
        alpha, b = self._fit(n, hist.batch_size, data[:, 0], data[:, 1])
        return _crossing(alpha, b, eps, hist.batch_size, n, horizon)

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray,
                         eps: np.ndarray, horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        alpha, b = self._fits_of(source)
        at = (rows, lengths - 1)
        raw = _crossing(alpha[at], b[at], eps, source.batch_size[rows], lengths, horizon)
        if optimistic is not None:  # a point estimate: its band is itself
            raw = np.stack([raw, raw], axis=1)
        return self._settle(raw, source.avg[at], lengths, eps, horizon)


def _crossing(alpha: np.ndarray, b: np.ndarray, eps: np.ndarray, batch_size: np.ndarray,
              n: np.ndarray, horizon: np.ndarray) -> np.ndarray:
    """Batches after n until the fitted power law reaches ε; the horizon if it never does."""
    crossing = b > 0
    # Guarded instead of np.errstate, whose set-up costs more than this whole fit.
    log_s = np.minimum((alpha - np.log(eps)) / np.where(crossing, b, 1.0), 700.0)
    remaining = np.exp(log_s) / batch_size - n
    return np.where(crossing, remaining, horizon)
