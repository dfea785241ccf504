"""The synthetic curve prior: seeded, scaled by the ID train curves, varied in shape, and used
by the FM data module as its mode says."""

from __future__ import annotations

import numpy as np
import pytest

from mara_fm.bank import load_bank, select
from mara_fm.curve_prior import sample_prior
from mara_fm.fm_data import FMDataModule
from mara_fm.fm_model import PredictorConfig


@pytest.fixture(scope="module")
def train(smoke_bank):
    return select(load_bank(smoke_bank), "id", "train")


def test_prior_is_seeded_finite_and_scaled_like_its_reference(train) -> None:
    a, b, c = sample_prior(train, 400, seed=0), sample_prior(train, 400, seed=0), sample_prior(train, 400, seed=1)
    assert np.array_equal(a.losses, b.losses) and not np.array_equal(a.losses, c.losses)
    assert a.losses.shape == (400, train.cap) and np.isfinite(a.avg).all() and (a.losses > 0).all()
    assert set(a.batch_size.tolist()) <= set(train.batch_size.tolist())
    # First losses come from the reference's, jittered: the medians agree within a factor 1.5.
    ratio = np.median(a.losses[:, :5].mean(1)) / np.median(train.losses[:, :5].mean(1))
    assert 1 / 1.5 < ratio < 1.5


def test_prior_covers_shapes_the_id_families_rarely_show(train) -> None:
    prior = sample_prior(train, 400, seed=0)

    def rising_share(avg: np.ndarray) -> float:
        """Share of curves whose cumulative average rises by 5% somewhere (spikes, divergence)."""
        return float((np.maximum.accumulate(avg[:, ::-1], axis=1)[:, ::-1] > 1.05 * avg).any(1).mean())

    late_drop = (prior.avg[:, 150] / prior.avg[:, 30] < 0.7) & (prior.avg[:, 30] / prior.avg[:, 0] > 0.95)
    assert rising_share(prior.avg) > 0.1 and late_drop.any()
    spread = np.log(prior.avg[:, -1] / prior.avg[:, 0])
    assert spread.min() < np.log(0.2) and spread.max() > np.log(0.9)  # from fast decay to almost flat


@pytest.mark.parametrize("mode", ["off", "pretrain", "mixture"])
def test_data_module_trains_on_the_curves_its_prior_mode_names(smoke_bank, train, mode: str) -> None:
    cfg = PredictorConfig(examples_per_curve=4, stats_examples_per_curve=4, prior=mode, prior_curves=50,
                          prior_epochs=2)
    data = FMDataModule(cfg, smoke_bank)
    data.setup()
    sizes = [len(data.epoch_curves(epoch)) for epoch in (0, 1, 2)]
    real = len(train)
    assert sizes == {"off": [real] * 3, "pretrain": [50, 50, real], "mixture": [real + 50] * 3}[mode]
    baseline = FMDataModule(PredictorConfig(examples_per_curve=4, stats_examples_per_curve=4), smoke_bank)
    baseline.setup()
    assert data.stats.target.mean.tolist() == baseline.stats.target.mean.tolist()  # real curves only


def test_prior_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="prior must be one of"):
        PredictorConfig(prior="always")
    with pytest.raises(ValueError, match="prior_curves"):
        PredictorConfig(prior_curves=0)
