"""Oracle: the true remaining batches, read off the task's real future curve."""

from __future__ import annotations

import numpy as np

from mara_fm.predictors.base import HistoryBatch, Predictor


def first_crossing(curves: np.ndarray, start: np.ndarray, eps: np.ndarray,
                   horizon: np.ndarray) -> np.ndarray:
    """Batches after `start` until curves[b] first reaches eps[b] (capped at horizon).

    `curves[b, i]` is the cumulative average after i+1 batches; with `start`
    batches done, the answer is j+1−start for the first j ≥ start at or below ε.
    """
    cols = np.arange(curves.shape[1])[None, :]
    hit = (curves <= eps[:, None]) & (cols >= start[:, None])
    found = hit.any(1)
    first = hit.argmax(1) + 1 - start
    return np.minimum(np.where(found, first, horizon), horizon).astype(np.float64)


class OraclePredictor(Predictor):
    """Knows the future: the upper reference for any learned predictor."""

    name = "oracle"
    uses_warmup = False

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        if hist.future is None:
            raise ValueError("the oracle predictor needs HistoryBatch.future (the true curves)")
        return first_crossing(hist.future, hist.lengths, eps, horizon)
