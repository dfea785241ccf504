"""Calibration of sampled crossing forecasts: reliability curve, its ties at the cap, sample CRPS."""

from __future__ import annotations

import numpy as np
import pytest

from mara_fm import eval_predictor
from mara_fm.bank import load_bank
from mara_fm.eval_predictor import (
    QueryConfig,
    bank_query_sets,
    calibration_max_dev,
    crossing_samples,
    crps,
    evaluate,
    markdown_table,
    reliability,
)
from mara_fm.predictors import WLSPredictor

M = 8
NOMINAL = np.arange(1, M + 1) / (M + 1)


def draws(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.gamma(2.0, 30.0, size=shape)


def test_samples_from_the_truth_distribution_are_calibrated():
    rng = np.random.default_rng(0)
    truth, samples = draws(rng, (4000,)), draws(rng, (4000, M))
    shares = reliability(samples, truth)
    assert np.all(np.abs(shares - NOMINAL) < 0.03)
    assert calibration_max_dev(shares) == pytest.approx(np.abs(shares - NOMINAL).max())


def test_capping_at_the_horizon_keeps_a_calibrated_sampler_calibrated():
    """About a third of truths and samples sit at the cap; random tie-breaking keeps k/(M+1)."""
    rng = np.random.default_rng(1)
    cap = 70.0
    truth, samples = np.minimum(draws(rng, (4000,)), cap), np.minimum(draws(rng, (4000, M)), cap)
    assert 0.25 < np.mean(truth == cap) < 0.45
    assert calibration_max_dev(reliability(samples, truth)) < 0.03


def test_tie_weights():
    # All M samples tie with the truth (both capped): the truth's rank is uniform on 0..M.
    assert reliability(np.full((1, M), 5.0), np.array([5.0])) == pytest.approx(NOMINAL)
    # One tie is the half weight; samples below count 0, above count 1.
    shares = reliability(np.array([[1.0, 2.0, 5.0, 9.0]]), np.array([5.0]))
    assert shares == pytest.approx([0.0, 0.0, 0.5, 1.0])


def test_shifted_samples_read_near_one_or_zero():
    rng = np.random.default_rng(2)
    truth, samples = draws(rng, (4000,)), draws(rng, (4000, M))
    assert np.all(reliability(samples + 1000.0, truth) > 0.99)
    assert np.all(reliability(samples - 1000.0, truth) < 0.01)


def test_crps_definition_and_properties():
    rng = np.random.default_rng(3)
    truth, samples = draws(rng, (500,)), draws(rng, (500, M))
    brute = (np.abs(samples - truth[:, None]).mean(1)
             - np.abs(samples[:, :, None] - samples[:, None, :]).sum((1, 2)) / (2 * M**2))
    got = crps(samples, truth)
    assert got == pytest.approx(brute)
    assert np.all(got >= -1e-9)
    point = draws(rng, (500,))
    assert crps(np.repeat(point[:, None], M, axis=1), truth) == pytest.approx(np.abs(point - truth))
    centred = truth[:, None] + rng.normal(0.0, 5.0, (500, M))
    assert crps(centred, truth).mean() < crps(centred + 40.0, truth).mean()


@pytest.fixture(scope="module")
def smoke_sets(smoke_bank):
    return bank_query_sets(load_bank(smoke_bank), QueryConfig())


def test_smoke_bank_reliability_and_crps(untrained_fm, smoke_sets):
    records = evaluate({"fm": untrained_fm, "wls": WLSPredictor()}, smoke_sets, timing=False)
    m = untrained_fm.cfg.samples
    for r in records:
        shares = np.asarray(r["reliability"])
        assert len(shares) == m
        assert np.all((shares >= 0) & (shares <= 1)) and np.all(np.diff(shares) >= 0)
        assert r["calibration_max_dev"] == pytest.approx(calibration_max_dev(shares))
        assert r["crps"] >= 0
        if r["predictor"] == "wls":  # M identical samples: the CRPS is the absolute error
            assert r["crps"] == pytest.approx(r["capped_mae"])
    md = markdown_table(records)
    assert "| CRPS | max calib. dev. |" in md
    assert all(row.split("|")[-3:-1] != [" — ", " — "] for row in md.splitlines()[2:])
    old = [{k: v for k, v in r.items() if k not in ("crps", "calibration_max_dev", "reliability")}
           for r in records]
    assert markdown_table(old).splitlines()[2].endswith("| — | — |")  # older JSON still renders


def test_fm_samples_agree_with_its_point_estimate(untrained_fm, smoke_sets, monkeypatch):
    """Sampled in chunks and clipped, the median of the samples is FM's `remaining_batches`."""
    monkeypatch.setattr(eval_predictor, "SAMPLE_CHUNK", 10)
    _, q = smoke_sets["id"]
    samples = crossing_samples(untrained_fm, q, untrained_fm.cfg.samples)
    assert samples.shape == (len(q), untrained_fm.cfg.samples)
    assert np.all(np.diff(samples, axis=1) >= 0) and np.all(samples <= q.horizon[:, None])
    median = np.median(samples, axis=1)
    assert median == pytest.approx(untrained_fm.remaining_batches(q.hist, q.eps, q.horizon))
