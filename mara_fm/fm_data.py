"""Training data for the FM predictor: examples sampled from ID curves.

An example is (train curve, prefix n ≥ 4, horizon k batches with n + k ≤ cap).
There are ~cap²/2 per curve, so none are stored: every epoch draws fresh
(n, k) pairs per curve from a generator seeded by (seed, epoch), which also
makes a resumed run see the same data it would have seen. Validation uses a
fixed draw on ID val curves, with fixed noise, so its FM loss is comparable
across epochs. The split is by curve (the bank's `split` column), or by family
when `PredictorConfig.heldout_families` is set (`split_curves`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import torch
from torch.utils.data import DataLoader, TensorDataset

from mara_fm.bank import CurveSet, load_bank, select
from mara_fm.build_bank import TRAINING_TASK_SETS
from mara_fm.curve_prior import ar1_paths, sample_prior
from mara_fm.eval_predictor import Queries, QueryConfig, make_queries, reference_curves, score
from mara_fm.fm_model import PredictorConfig
from mara_fm.predictors import WARMUP_POINTS
from mara_fm.targets import (
    Standardizer,
    Stats,
    encode_targets,
    history_features,
    static_features,
)


def wobble(losses: np.ndarray, share: float, sigma: float, length: float,
           rng: np.random.Generator) -> np.ndarray:
    """`losses` with a share of rows multiplied by exp(σ·z), z a unit-variance AR(1) path.

    The correlation length (batches) keeps the factor smooth, so the cumulative
    average of a wobbled curve rises where the factor climbs faster than the
    loss falls, then settles (see `PredictorConfig.augment_prob`).
    """
    n, cap = losses.shape
    z = ar1_paths(rng, n, cap, length)
    chosen = rng.random(n) < share
    return np.where(chosen[:, None], losses * np.exp(sigma * z), losses)


def split_curves(frame: pd.DataFrame, heldout: tuple[str, ...] = ()) -> tuple[CurveSet, CurveSet]:
    """(train, val) curves of the training families (ID, and wide when `frame` holds them):
    by the bank's split, or with `heldout` families as val.

    Held-out families give up their train and val curves to validation (their
    test curves stay untouched) and the other families' val curves go unused.
    """
    ids = frame[frame["task_set"].isin(TRAINING_TASK_SETS)].assign(task_set="id")
    if not heldout:
        return select(ids, "id", "train"), select(ids, "id", "val")
    families = set(ids["family"])
    unknown = sorted(set(heldout) - families)
    if unknown:
        raise ValueError(f"heldout_families {unknown} are not training families of the bank "
                         f"(it has {sorted(families)}; wide families need wide_families = true)")
    if families <= set(heldout):
        raise ValueError(f"heldout_families {sorted(heldout)} leave no family to train on")
    held = ids["family"].isin(heldout)
    split = ids["split"].where(~held | (ids["split"] == "test"), "val")
    split = split.where(held | (split != "val"), "unused")
    relabelled = ids.assign(split=split)
    return select(relabelled, "id", "train"), select(relabelled, "id", "val")


def sample_examples(n_curves: int, cap: int, per_curve: int, cfg: PredictorConfig,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(curve row, prefix length n, horizon k in batches) for `per_curve` examples per curve.

    n is log-uniform on [4, cap − 1] with probability `short_prefix_prob`,
    else uniform: every task passes through the short prefixes, where
    forecasts are hardest, and a uniform n would rarely show them. k is the
    whole rest of the curve with probability `full_horizon_prob` (the
    simulator's default horizon), else uniform on [min(min_horizon, cap − n), cap − n].
    """
    rows = np.repeat(np.arange(n_curves), per_curve)
    log_n = np.exp(rng.uniform(np.log(WARMUP_POINTS), np.log(cap), size=len(rows))).astype(np.int64)
    n = np.where(rng.random(len(rows)) < cfg.short_prefix_prob, log_n,
                 rng.integers(WARMUP_POINTS, cap, size=len(rows)))
    room = cap - n
    low = np.minimum(cfg.min_horizon, room)
    k = np.where(rng.random(len(rows)) < cfg.full_horizon_prob, room, rng.integers(low, room + 1))
    return rows, n, k


def raw_examples(curves: CurveSet, rows: np.ndarray, n: np.ndarray, k: np.ndarray,
                 cfg: PredictorConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unstandardised (points, counts, static, y) for the given examples."""
    avg, b = curves.avg[rows], curves.batch_size[rows]
    h = (k * b).astype(np.float64)
    points, counts = history_features(avg, n, b, cfg.max_points, cfg.recent_points, cfg.interval_window)
    static = static_features(b, curves.lr[rows] if cfg.lr_input else None, avg[np.arange(len(n)), n - 1], h)
    y = encode_targets(avg, b, n, h, cfg.n_boundaries, cfg.delta)
    return points, counts, static, y


def fit_stats(curves: CurveSet, cfg: PredictorConfig) -> Stats:
    """Standardisation statistics from a large seeded draw of train examples."""
    rng = np.random.default_rng([cfg.seed, 1])
    points, counts, static, y = raw_examples(
        curves, *sample_examples(len(curves), curves.cap, cfg.stats_examples_per_curve, cfg, rng), cfg)
    real = np.arange(points.shape[1])[None, :] < counts[:, None]
    return Stats(Standardizer.fit(points[real]), Standardizer.fit(static), Standardizer.fit(y))


def to_tensors(points: np.ndarray, counts: np.ndarray, static: np.ndarray, y: np.ndarray,
               stats: Stats) -> list[torch.Tensor]:
    return [torch.from_numpy(stats.history.apply(points).astype(np.float32)),
            torch.from_numpy(counts),
            torch.from_numpy(stats.static.apply(static).astype(np.float32)),
            torch.from_numpy(stats.target.apply(y).astype(np.float32))]


class FMDataModule(L.LightningDataModule):
    """ID train curves (and the wide bank's, with `wide_families`) for training; their val
    curves (or held-out families) for the val FM loss and capped MAE."""

    def __init__(self, cfg: PredictorConfig, bank_path: str | Path,
                 query_cfg: QueryConfig | None = None, wide_bank_path: str | Path | None = None) -> None:
        super().__init__()
        if cfg.wide_families and wide_bank_path is None:
            raise ValueError("PredictorConfig.wide_families is set but no wide bank was given")
        self.cfg = cfg
        self.bank_path = Path(bank_path)
        self.wide_bank_path = Path(wide_bank_path) if cfg.wide_families else None
        self.query_cfg = query_cfg or QueryConfig()
        self.stats: Stats | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.stats is not None:
            return
        cfg = self.cfg
        frame = load_bank(self.bank_path)
        if self.wide_bank_path is not None:
            frame = pd.concat([frame, load_bank(self.wide_bank_path)], ignore_index=True)
        train, val = split_curves(frame, cfg.heldout_families)
        self.train = train
        self.stats = fit_stats(self.train, cfg)
        self.prior = sample_prior(train, cfg.prior_curves, cfg.seed) if cfg.prior != "off" else None
        rng = np.random.default_rng([cfg.seed, 2])
        val_data = to_tensors(*raw_examples(val, *sample_examples(
            len(val), val.cap, cfg.val_examples_per_curve, cfg, rng), cfg), self.stats)
        gen = torch.Generator().manual_seed(cfg.seed)
        z0 = torch.randn(val_data[3].shape, generator=gen)
        u = torch.rand(len(z0), generator=gen)
        self.val_set = TensorDataset(*val_data, z0, u)
        self.val_queries: Queries = make_queries(val, reference_curves(val, train), self.query_cfg)
        train_queries = make_queries(train, reference_curves(train, train), self.query_cfg)
        # A predictor that ignores the prefix: the median true remaining demand of train queries.
        self.constant = float(np.median(train_queries.truth))
        self.constant_val = score(np.full(len(self.val_queries), self.constant), self.val_queries)

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        cfg = self.cfg
        rng = np.random.default_rng([cfg.seed, 3, epoch])
        curves = self.epoch_curves(epoch)
        rows, n, k = sample_examples(len(curves), curves.cap, cfg.examples_per_curve, cfg, rng)
        order = rng.permutation(len(rows))
        if cfg.augment_prob > 0:
            aug_rng = np.random.default_rng([cfg.seed, 4, epoch])
            curves = dataclasses.replace(curves, losses=wobble(curves.losses, cfg.augment_prob,
                                                               cfg.augment_sigma, cfg.augment_length, aug_rng))
        data = to_tensors(*raw_examples(curves, rows[order], n[order], k[order], cfg), self.stats)
        return DataLoader(TensorDataset(*data), batch_size=cfg.batch_size, shuffle=False)

    def epoch_curves(self, epoch: int) -> CurveSet:
        """The curves an epoch trains on: the real train curves, the prior's during
        pre-training, or both (`PredictorConfig.prior`)."""
        if self.prior is None or (self.cfg.prior == "pretrain" and epoch >= self.cfg.prior_epochs):
            return self.train
        if self.cfg.prior == "pretrain":
            return self.prior
        return CurveSet(*(np.concatenate([getattr(self.train, f), getattr(self.prior, f)])
                          for f in ("ids", "families", "batch_size", "lr", "losses")))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=4 * self.cfg.batch_size, shuffle=False)
