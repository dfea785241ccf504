"""The FM training data: the wobble augmentation and its switch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mara_fm.bank import load_bank, select
from mara_fm.fm_data import FMDataModule, wobble
from mara_fm.fm_model import PredictorConfig


@pytest.fixture(scope="module")
def losses(smoke_bank):
    return select(load_bank(smoke_bank), "id", "train").losses


def test_wobble_is_seeded_positive_and_touches_only_its_share(losses):
    a = wobble(losses, 0.5, 0.5, 30.0, np.random.default_rng(3))
    b = wobble(losses, 0.5, 0.5, 30.0, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(a)) and np.all(a > 0)
    changed = np.any(a != losses, axis=1)
    assert 0 < changed.sum() < len(losses)
    np.testing.assert_array_equal(wobble(losses, 0.0, 0.5, 30.0, np.random.default_rng(3)), losses)


def test_wobble_makes_cumulative_averages_rise(smoke_bank):
    curves = select(load_bank(smoke_bank), "id", "train")

    def rising_share(c):
        return float(np.mean(np.diff(c.log_avg, axis=1) > 0.002))

    wobbled = dataclasses.replace(curves, losses=wobble(curves.losses, 1.0, 0.5, 30.0, np.random.default_rng(0)))
    assert rising_share(wobbled) > rising_share(curves) + 0.05


def test_augmentation_changes_training_targets_only_when_on(smoke_bank):
    def first_batch(**overrides):
        data = FMDataModule(PredictorConfig(examples_per_curve=4, **overrides), smoke_bank)
        data.setup()
        return next(iter(data.train_dataloader()))

    plain, again, augmented = first_batch(), first_batch(), first_batch(augment_prob=1.0)
    for x, y in zip(plain, again, strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(plain[3], augmented[3])


@pytest.mark.parametrize("bad", [{"augment_prob": 1.5}, {"augment_sigma": -0.1}, {"augment_length": 0.0}])
def test_bad_augmentation_settings_are_refused(bad):
    with pytest.raises(ValueError, match="augment"):
        PredictorConfig(**bad)
