"""Prefix encoding and flow-matching targets (docs/design.md §5.1), in NumPy.

Training (thousands of examples per epoch) and prediction (a few prefixes per
simulator step) go through the same vectorised functions, so the encoding the
model was trained on is the one it sees in the simulator.

One deliberate departure from "every observed point goes into the GRU": a
prefix longer than `max_points` is thinned to its first point, log-spaced
older points and its `recent_points` latest points (each still encoded as
(log s, log L/L_cur, Δ log s, Δ log L/L_cur), Δ taken along the thinned
sequence). A 300-step GRU costs ~10x a 32-step one on CPU, which would break
the simulator's speed budget, and a cumulative average changes slowly, so the
dropped points carry little that the kept ones do not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

HISTORY_FEATURES = 4  # log s, log(L/L_cur), Δ log s, Δ log(L/L_cur)
STATIC_FEATURES = 4  # log B, log lr, log L_cur, log h


def history_width(interval_window: int) -> int:
    """Features per encoded point: the four of `HISTORY_FEATURES`, and the interval mean when W > 0."""
    return HISTORY_FEATURES + (interval_window > 0)


def thinning_table(width: int, max_points: int, recent_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Point indices kept for every prefix length 0..width, and how many.

    Row n lists the kept indices of a prefix of n points in increasing order,
    padded by repeating the last one (so gathered values stay finite); the
    count says how many are real. Rows do not depend on `width`, so one table
    (grown by doubling) serves every call.
    """
    size = max(512, 1 << int(width).bit_length())
    table, counts = _thinning_table(size, max_points, recent_points)
    return table[: width + 1], counts[: width + 1]


@functools.lru_cache(maxsize=16)
def _thinning_table(size: int, max_points: int, recent_points: int) -> tuple[np.ndarray, np.ndarray]:
    if not 0 < recent_points < max_points:
        raise ValueError(f"need 0 < recent_points ({recent_points}) < max_points ({max_points})")
    table = np.zeros((size + 1, max_points), dtype=np.int64)
    counts = np.zeros(size + 1, dtype=np.int64)
    for n in range(1, size + 1):
        if n <= max_points:
            kept = np.arange(n)
        else:
            older = n - recent_points  # points 0..older-1 are thinned log-uniformly in s
            picks = np.geomspace(1, older, max_points - recent_points).round().astype(np.int64) - 1
            kept = np.concatenate([np.unique(picks), np.arange(older, n)])
        counts[n] = len(kept)
        table[n, : len(kept)] = kept
        table[n, len(kept):] = kept[-1]
    table.flags.writeable = False
    counts.flags.writeable = False
    return table, counts


def history_features(avg: np.ndarray, lengths: np.ndarray, batch_size: np.ndarray,
                     max_points: int, recent_points: int,
                     interval_window: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-point features of each (thinned) prefix: (E, max_points, 4 or 5) and counts (E,).

    `avg` holds cumulative averages, row e valid up to `lengths[e]` (the rest
    is ignored); point i sits at s = (i+1)·batch_size. With `interval_window`
    W > 0 a 5th feature gives, per kept point, log of the mean per-batch loss
    over the batches since the previous kept point, at least the last W, over
    L_cur: the past in the form of FM's targets (`encode_targets`), where a
    cumulative average hides the current loss.
    """
    table, count_table = thinning_table(avg.shape[1], max_points, recent_points)
    idx = table[lengths]
    counts = count_table[lengths]
    rows = np.arange(len(lengths))
    log_loss = np.log(avg[rows[:, None], idx])
    feats = np.empty((*idx.shape, history_width(interval_window)))
    feats[..., 0] = np.log(idx + 1.0) + np.log(batch_size.astype(np.float64))[:, None]
    feats[..., 1] = log_loss - log_loss[rows, counts - 1][:, None]  # the last kept point is L_cur
    feats[:, 0, 2:4] = 0.0
    feats[:, 1:, 2:4] = np.diff(feats[..., :2], axis=1)
    if interval_window > 0:
        means = interval_mean_losses(avg, idx, interval_window)
        feats[..., 4] = np.log(means) - log_loss[rows, counts - 1][:, None]
    return feats, counts


def interval_mean_losses(avg: np.ndarray, idx: np.ndarray, window: int) -> np.ndarray:
    """(E, P): at each kept point idx[e, i], the mean per-batch loss over the batches since the
    previous kept point, at least the last `window` (all of them if fewer), recovered from the
    cumulative averages: (k·L_k − j·L_j) / (k − j), k = idx + 1 batches. A padded point (a
    repeat of the last) gets the mean of its last `window` batches, finite and never read;
    rounding below zero is floored."""
    rows = np.arange(len(idx))[:, None]
    k = idx + 1
    previous = np.concatenate([np.zeros_like(k[:, :1]), k[:, :-1]], axis=1)
    j = np.maximum(np.minimum(previous, k - window), 0)
    at_k = avg[rows, idx]
    at_j = np.where(j > 0, avg[rows, np.maximum(j - 1, 0)], 0.0)
    return np.maximum((k * at_k - j * at_j) / (k - j), 1e-6 * at_k)


def static_width(lr_input: bool) -> int:
    """Static features the context reads: the four of `STATIC_FEATURES`, or three without log lr."""
    return STATIC_FEATURES - (not lr_input)


def static_features(batch_size: np.ndarray, lr: np.ndarray | None, current: np.ndarray,
                    horizon_samples: np.ndarray) -> np.ndarray:
    """(E, 4): log B, log lr, log L_cur, log h; (E, 3) without log lr when `lr` is None
    (`PredictorConfig.lr_input`). ε is absent on purpose (§5.1)."""
    b = batch_size.astype(np.float64)
    columns = [b, current, horizon_samples] if lr is None else [b, lr, current, horizon_samples]
    return np.log(np.stack(columns, axis=-1))


def boundaries(start: np.ndarray, horizon_samples: np.ndarray, n_boundaries: int) -> np.ndarray:
    """s_j = S_0 + j·h/H for j = 0..H, shape (E, H+1)."""
    frac = np.arange(n_boundaries + 1) / n_boundaries
    return start[:, None] + horizon_samples[:, None] * frac


def cumulative_loss(avg: np.ndarray, batch_size: np.ndarray, s: np.ndarray) -> np.ndarray:
    """C(s) = s·L(s), linear between the knots (k·B, k·B·L_k) with C(0) = 0.

    Knots are evenly spaced (B apart) in every row, so the interpolation is a
    floor and a blend rather than a search; s must lie within the curve.
    """
    n_rows, cap = avg.shape
    b = batch_size[:, None].astype(np.float64)
    knots = np.zeros((n_rows, cap + 2))
    knots[:, 1 : cap + 1] = np.arange(1, cap + 1) * b * avg
    knots[:, cap + 1] = knots[:, cap]  # lets s = cap·B take k = cap with weight 0 on k+1
    pos = s / b
    k = np.clip(np.floor(pos).astype(np.int64), 0, cap)
    if np.any(pos > cap + 1e-9) or np.any(pos < 0):
        raise ValueError("cumulative_loss: a boundary lies outside the stored curve")
    w = pos - k
    lo = np.take_along_axis(knots, k, axis=1)
    hi = np.take_along_axis(knots, k + 1, axis=1)
    return lo + w * (hi - lo)


def encode_targets(avg: np.ndarray, batch_size: np.ndarray, lengths: np.ndarray,
                   horizon_samples: np.ndarray, n_boundaries: int, delta: float) -> np.ndarray:
    """y_j = log(ℓ̄_j + δ) − log(L(S_0) + δ), j = 1..H, from whole true curves (E, cap)."""
    start = lengths * batch_size.astype(np.float64)
    s = boundaries(start, horizon_samples, n_boundaries)
    c = cumulative_loss(avg, batch_size, s)
    interval_mean = np.diff(c, axis=1) / np.diff(s, axis=1)
    current = avg[np.arange(len(lengths)), lengths - 1]
    return np.log(interval_mean + delta) - np.log(current + delta)[:, None]


def decode_targets(y: np.ndarray, current: np.ndarray, start: np.ndarray,
                   horizon_samples: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of `encode_targets`: (Ĉ(s_j), L̂(s_j)) for j = 0..H.

    `y` is (E, ..., H) (extra axes, e.g. samples, broadcast); the other inputs
    are (E,). Returns arrays of shape (E, ..., H+1).
    """
    n_boundaries = y.shape[-1]
    extra = (1,) * (y.ndim - 2)
    s = boundaries(start, horizon_samples, n_boundaries).reshape(len(start), *extra, -1)
    cur = current.reshape(-1, *extra, 1)
    width = (horizon_samples / n_boundaries).reshape(-1, *extra, 1)
    c = np.empty((*y.shape[:-1], n_boundaries + 1))
    c[..., :1] = start.reshape(-1, *extra, 1) * cur
    np.cumsum(((cur + delta) * np.exp(y) - delta) * width, axis=-1, out=c[..., 1:])
    c[..., 1:] += c[..., :1]
    return c, c / s


def crossing_batches(loss_paths: np.ndarray, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
    """Remaining batches until each path first reaches ε (docs/design.md §5.1 decoding).

    `loss_paths` (E, M, H+1) holds L̂ at the equal-width boundaries s_j of a
    horizon of `horizon` (E,) batches. The crossing is interpolated linearly
    between the last boundary above ε and the first at or below it; since the
    boundaries are equally spaced, s* − S_0 = (j − 1 + frac)·h/H. A path that
    never crosses gives the horizon.
    """
    n_rows, m, width = loss_paths.shape
    e = eps[:, None]
    below = loss_paths <= e[..., None]
    j = below.argmax(axis=-1)
    prev = np.maximum(j - 1, 0)
    flat = loss_paths.reshape(-1, width)
    rows = np.arange(n_rows * m)
    l_prev = flat[rows, prev.ravel()].reshape(n_rows, m)
    l_hit = flat[rows, j.ravel()].reshape(n_rows, m)
    drop = l_prev - l_hit
    frac = np.divide(l_prev - e, drop, out=np.zeros_like(drop), where=drop > 0)
    steps = prev + np.clip(frac, 0.0, 1.0) * (j - prev)
    return np.where(below.any(axis=-1), steps * (horizon / (width - 1))[:, None], horizon[:, None])


@dataclass(frozen=True)
class Standardizer:
    """Per-coordinate mean and std from training data (std floored for constants)."""

    mean: np.ndarray
    std: np.ndarray

    @staticmethod
    def fit(x: np.ndarray, floor: float = 1e-6) -> Standardizer:
        flat = x.reshape(-1, x.shape[-1])
        return Standardizer(flat.mean(0), np.maximum(flat.std(0), floor))

    def apply(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.std

    def invert(self, z: np.ndarray) -> np.ndarray:
        return z * self.std + self.mean

    def to_json(self) -> dict[str, list[float]]:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @staticmethod
    def from_json(obj: dict[str, list[float]]) -> Standardizer:
        return Standardizer(np.asarray(obj["mean"], np.float64), np.asarray(obj["std"], np.float64))


@dataclass(frozen=True)
class Stats:
    """Training-set statistics of the history, static and target coordinates."""

    history: Standardizer
    static: Standardizer
    target: Standardizer

    def to_json(self) -> dict[str, dict[str, list[float]]]:
        return {"history": self.history.to_json(), "static": self.static.to_json(),
                "target": self.target.to_json()}

    @staticmethod
    def from_json(obj: dict) -> Stats:
        return Stats(*(Standardizer.from_json(obj[k]) for k in ("history", "static", "target")))
