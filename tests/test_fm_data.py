"""The FM training data: family-held-out validation, the wobble augmentation and its switch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mara_fm.bank import load_bank, select
from mara_fm.fm_data import FMDataModule, split_curves, wobble
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


def test_heldout_families_move_from_training_to_validation(smoke_bank):
    frame = load_bank(smoke_bank)
    train, val = split_curves(frame)
    families = train.family_names()
    held = (families[0],)
    h_train, h_val = split_curves(frame, held)
    assert held[0] not in h_train.family_names()
    assert h_val.family_names() == [held[0]]
    # Its train and val curves validate; the other families keep exactly their train curves.
    own = frame[(frame["family"] == held[0]) & frame["split"].isin(["train", "val"])]
    assert sorted(h_val.ids) == sorted(own["curve_id"])
    assert sorted(h_train.ids) == sorted(i for i, f in zip(train.ids, train.families, strict=True) if f != held[0])
    data = FMDataModule(PredictorConfig(examples_per_curve=4, heldout_families=held), smoke_bank)
    data.setup()
    assert sorted(data.train.ids) == sorted(h_train.ids)
    assert len(data.val_queries) > 0 and data.val_queries.curve.max() < len(h_val)


@pytest.mark.parametrize("bad, message", [(("no_such_family",), "not training families"), (None, "no family to train")])
def test_bad_heldout_families_are_refused(smoke_bank, bad, message):
    frame = load_bank(smoke_bank)
    held = tuple(sorted(set(frame.loc[frame["task_set"] == "id", "family"]))) if bad is None else bad
    with pytest.raises(ValueError, match=message):
        split_curves(frame, held)
    with pytest.raises(ValueError, match="list of family names"):
        PredictorConfig(heldout_families="mlp_wine")


def test_wide_families_join_training_and_can_be_held_out(smoke_bank, smoke_wide_bank):
    cfg = PredictorConfig(examples_per_curve=4, wide_families=True)
    data = FMDataModule(cfg, smoke_bank, wide_bank_path=smoke_wide_bank)
    data.setup()
    wide = load_bank(smoke_wide_bank)
    assert set(wide["task_set"]) == {"wide"}
    wide_train = set(wide.loc[wide["split"] == "train", "curve_id"])
    id_only = FMDataModule(PredictorConfig(examples_per_curve=4), smoke_bank, wide_bank_path=smoke_wide_bank)
    id_only.setup()
    assert set(data.train.ids) == set(id_only.train.ids) | wide_train  # without the flag the wide bank is unread
    held = FMDataModule(dataclasses.replace(cfg, heldout_families=("gcn_blocks",)), smoke_bank,
                        wide_bank_path=smoke_wide_bank)
    held.setup()
    assert "gcn_blocks" not in held.train.family_names() and held.val_queries.curve.max() < len(
        wide[(wide["family"] == "gcn_blocks") & (wide["split"] != "test")])
    with pytest.raises(ValueError, match="no wide bank"):
        FMDataModule(cfg, smoke_bank)
    with pytest.raises(ValueError, match="wide_families = true"):
        split_curves(load_bank(smoke_bank), ("gcn_blocks",))
