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
        self._grow(512)

    def _grow(self, length: int) -> None:
        """Tables of γ^lag and log(i) so a refresh costs no pow/log per point."""
        self._powers = np.append(self.gamma ** np.arange(length), 0.0)  # last entry: masked
        self._log_idx = np.log(np.arange(1, length + 1))

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        n = hist.lengths
        width = hist.avg.shape[1]
        if width >= len(self._log_idx):
            self._grow(2 * width)
        lag = n[:, None] - np.arange(1, width + 1)[None, :]
        w = self._powers[np.where(lag >= 0, lag, -1)]  # γ^(n−i) on observed points, else 0
        x = self._log_idx[None, :width] + np.log(hist.batch_size.astype(np.float64))[:, None]
        y = np.log(np.where(lag >= 0, hist.avg, 1.0))
        wx, wy = w * x, w * y
        sw, sx, sy = w.sum(1) + self.ridge, wx.sum(1), wy.sum(1)
        sxx, sxy = (wx * x).sum(1) + self.ridge, (wx * y).sum(1)
        slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx)
        alpha = (sy - slope * sx) / sw
        b = -slope
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            s_star = np.exp((alpha - np.log(eps)) / np.where(b > 0, b, 1.0))
            remaining = s_star / hist.batch_size - n
        return np.where((b > 0) & np.isfinite(remaining), remaining, horizon)
