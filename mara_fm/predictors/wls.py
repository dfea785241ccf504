"""WLS: the power-law extrapolation used by LARA (DESIGN §5.2)."""

from __future__ import annotations

import numpy as np

from mara_fm.predictors.base import HistoryBatch, Predictor


class WLSPredictor(Predictor):
    """Fit log L = α − b·log s with forgetting weights γ^(n−i); solve for ε.

    Recent points weigh more, so the fit follows the current slope of the
    curve; a non-decreasing fit (b ≤ 0) never crosses and returns the horizon.
    """

    name = "wls"

    def __init__(self, gamma: float = 0.9, ridge: float = 1e-6) -> None:
        if not 0 < gamma <= 1:
            raise ValueError(f"WLS forgetting factor gamma={gamma} must be in (0, 1]")
        self.gamma = gamma
        self.ridge = ridge
        self._grow(512)  # history length; grown on demand

    def _grow(self, length: int) -> None:
        """Tables that make a refit cost two mat-vec products per batch of tasks.

        With x_i = log i + log B, every weighted moment splits into a part that
        depends only on n (prefix sums of γ^(n−i)·(log i)^p, tabulated here) and
        the data terms Σ γ^(n−i)·y_i·(log i)^p = γ^n · Σ γ^(−i)·y_i·(log i)^p.
        """
        i = np.arange(1, length + 1)
        log_i = np.log(i)
        self._inv_powers = np.stack([self.gamma ** -i, self.gamma ** -i * log_i], axis=1)  # (L, 2)
        self._powers = self.gamma ** np.arange(length + 1)
        tables = np.zeros((3, length + 1))
        for n in range(1, length + 1):
            tables[:, n] = self.gamma * tables[:, n - 1] + log_i[n - 1] ** np.arange(3)
        self._tables = tables  # [Σγ^(n−i), Σγ^(n−i)·log i, Σγ^(n−i)·log² i] by n

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        n = hist.lengths
        width = hist.avg.shape[1]
        if width > len(self._inv_powers):
            self._grow(2 * width)
        y = hist.log_prefix()  # 0 beyond the prefix, so those points add nothing
        data = (y @ self._inv_powers[:width]) * self._powers[n][:, None]  # Σw·y, Σw·y·log i
        t0, t1, t2 = self._tables[:, n]
        log_b = np.log(hist.batch_size.astype(np.float64))
        sw = t0 + self.ridge
        sx = t1 + log_b * t0
        sxx = t2 + 2 * log_b * t1 + log_b**2 * t0 + self.ridge
        sy = data[:, 0]
        sxy = data[:, 1] + log_b * sy
        slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
        alpha = (sy - slope * sx) / sw
        b = -slope
        crossing = b > 0
        # Guarded instead of np.errstate, whose set-up costs more than this whole fit.
        log_s = np.minimum((alpha - np.log(eps)) / np.where(crossing, b, 1.0), 700.0)
        remaining = np.exp(log_s) / hist.batch_size - n
        return np.where(crossing, remaining, horizon)
