"""A synthetic prior over loss-curve shapes, for FM to learn from beside the real curves.

A handful of real families teach FM a handful of shapes; the curves of an unseen job kind
(RL, a ViT) bend in other ways. LC-PFN and FT-PFN answer with a prior over
curve shapes; this module takes the idea at FM's scale: a seeded generator of
per-batch loss curves whose cumulative averages FM trains on
(`PredictorConfig.prior`: pre-training, then the real curves; or a mixture).

Scales come from the real **train** curves FM trains on only (ID, and the wide
bank's with `PredictorConfig.wide_families`; never validation, test or the OOD sets): each synthetic curve borrows a random train curve's batch size,
learning rate, first loss and final-to-first loss ratio (each jittered by
exp(N(0, 0.3²))). Its shape is drawn, independently per curve:

| part | probability | parameters |
|---|---|---|
| decay | power law 1/2, else exponential | power: (1 + t/τ)^−α, α ~ U(0.3, 2), τ ~ logU(1, 100); exp: e^(−t/τ), τ ~ logU(5, 3·cap) |
| plateau that breaks late | 0.15 | flat until t0 ~ U(0.1, 0.6)·cap, then the decay |
| warm-up | 0.2 | time runs slow for w ~ logU(3, 30) batches: t_eff = t·min(1, t/w) |
| learning-rate schedule | step 0.15, cosine 0.15 | step at U(0.3, 0.8)·cap lowers the floor ×U(0.3, 0.8); cosine: t_eff = t/2 + (cap/2π)·sin(πt/cap), floor lowered ×U(0.5, 0.9) along it |
| noise | always | loss × exp(σ·z), z a unit AR(1) path of correlation length logU(1, 30), σ ~ logU(0.003, 0.4) |
| spikes | 0.15 | 1–3 spikes of height logU(0.1, 2), decaying over logU(1, 20) batches |
| divergence and recovery | 0.1 | over logU(10, 80) batches from U(0.1, 0.7)·cap the loss rises to ×(1 + U(0.2, 1.5)) and comes back |

loss(t) = floor + (first − floor)·decay(t_eff), then the multiplicative parts;
the floor is first × ratio. Losses stay above 1e-6.
"""

from __future__ import annotations

import numpy as np

from mara_fm.bank import CurveSet

JITTER = 0.3


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, size: int | None = None) -> np.ndarray:
    return np.exp(rng.uniform(np.log(lo), np.log(hi), size))


def ar1_paths(rng: np.random.Generator, rows: int, cap: int, length: float) -> np.ndarray:
    """(rows, cap) unit-variance AR(1) paths with correlation length `length` (steps)."""
    rho = float(np.exp(-1.0 / length))
    noise = rng.standard_normal((rows, cap))
    z = np.empty((rows, cap))
    z[:, 0] = noise[:, 0]
    for t in range(1, cap):
        z[:, t] = rho * z[:, t - 1] + np.sqrt(1.0 - rho * rho) * noise[:, t]
    return z


def prior_curve(rng: np.random.Generator, cap: int, first: float, ratio: float) -> np.ndarray:
    """One synthetic per-batch loss curve of `cap` batches (see the module docstring)."""
    t = np.arange(1, cap + 1, dtype=np.float64)
    floor = np.full(cap, first * ratio)
    t_eff = t.copy()
    if rng.random() < 0.2:  # warm-up: progress starts slow
        t_eff = t_eff * np.minimum(1.0, t / _log_uniform(rng, 3, 30))
    schedule = rng.random()
    if schedule < 0.15:  # step decay of the learning rate
        floor = np.where(t >= rng.uniform(0.3, 0.8) * cap, floor * rng.uniform(0.3, 0.8), floor)
    elif schedule < 0.3:  # cosine schedule
        t_eff = 0.5 * t_eff + cap / (2 * np.pi) * np.sin(np.pi * np.minimum(t_eff, cap) / cap)
        floor = floor * (1.0 - (1.0 - rng.uniform(0.5, 0.9)) * t / cap)
    if rng.random() < 0.15:  # a plateau that breaks late
        t0 = rng.uniform(0.1, 0.6) * cap
        t_eff = np.maximum(t_eff - t0, 0.0)
    if rng.random() < 0.5:
        decay = (1.0 + t_eff / _log_uniform(rng, 1, 100)) ** -rng.uniform(0.3, 2.0)
    else:
        decay = np.exp(-t_eff / _log_uniform(rng, 5, 3 * cap))
    loss = floor + (first - floor) * decay
    loss = loss * np.exp(_log_uniform(rng, 0.003, 0.4) * ar1_paths(rng, 1, cap, _log_uniform(rng, 1, 30))[0])
    if rng.random() < 0.15:  # spikes
        for _ in range(rng.integers(1, 4)):
            at, height, width = rng.uniform(0, cap), _log_uniform(rng, 0.1, 2), _log_uniform(rng, 1, 20)
            loss = loss * (1.0 + height * np.where(t >= at, np.exp(-(t - at) / width), 0.0))
    if rng.random() < 0.1:  # divergence, then recovery
        start, span = rng.uniform(0.1, 0.7) * cap, _log_uniform(rng, 10, 80)
        bump = np.clip(1.0 - np.abs((t - start - span / 2) / (span / 2)), 0.0, None)
        loss = loss * (1.0 + rng.uniform(0.2, 1.5) * bump)
    return np.maximum(loss, 1e-6)


def sample_prior(reference: CurveSet, count: int, seed: int) -> CurveSet:
    """`count` synthetic curves scaled like `reference` (the real train curves), from `seed`."""
    if count < 1:
        raise ValueError(f"a curve prior needs count >= 1, got {count}")
    rng = np.random.default_rng([seed, 7])
    cap = reference.cap
    donors = rng.integers(0, len(reference), count)
    first = reference.losses[:, :5].mean(1)
    ratio = reference.losses[:, -20:].mean(1) / first
    losses = np.stack([
        prior_curve(rng, cap, float(first[d] * np.exp(JITTER * rng.standard_normal())),
                    float(np.clip(ratio[d] * np.exp(JITTER * rng.standard_normal()), 1e-3, 1.2)))
        for d in donors])
    return CurveSet(ids=np.array([f"prior-{seed}-{i}" for i in range(count)]),
                    families=np.full(count, "prior"), batch_size=reference.batch_size[donors].copy(),
                    lr=reference.lr[donors].copy(), losses=losses)
