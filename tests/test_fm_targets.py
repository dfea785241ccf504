"""Targets and prefix encoding of the FM predictor (docs/design.md §5.1) on real smoke curves."""

from __future__ import annotations

import numpy as np
import pytest

from mara_fm.bank import load_bank, select
from mara_fm.targets import (
    Standardizer,
    boundaries,
    crossing_batches,
    cumulative_loss,
    decode_targets,
    encode_targets,
    history_features,
    thinning_table,
)


@pytest.fixture(scope="module")
def curves(smoke_bank):
    return select(load_bank(smoke_bank), "id", "train")


def _examples(curves, rng, count=200):
    rows = rng.integers(0, len(curves), count)
    n = rng.integers(4, curves.cap, count)
    k = rng.integers(1, curves.cap - n + 1)
    b = curves.batch_size[rows]
    return curves.avg[rows], b, n, (k * b).astype(float)


def test_decoding_the_true_target_gives_back_true_cumulative_loss(curves):
    avg, b, n, h = _examples(curves, np.random.default_rng(0))
    y = encode_targets(avg, b, n, h, 32, 1e-8)
    start = (n * b).astype(float)
    current = avg[np.arange(len(n)), n - 1]
    c_hat, l_hat = decode_targets(y, current, start, h, 1e-8)
    s = boundaries(start, h, 32)
    c_true = cumulative_loss(avg, b, s)
    np.testing.assert_allclose(c_hat, c_true, rtol=1e-9)
    np.testing.assert_allclose(l_hat, c_true / s, rtol=1e-9)
    np.testing.assert_allclose(l_hat[:, 0], current, rtol=1e-12)


def test_interval_averages_are_mean_batch_losses_on_whole_batches(curves):
    """With boundaries on batch edges, ℓ̄_j is exactly the mean of the raw losses in interval j."""
    b, n, per = curves.batch_size[:1], np.array([10]), 8
    y = encode_targets(curves.avg[:1], b, n, (32 * per * b).astype(float), 32, 0.0)
    raw = curves.losses[0, 10 : 10 + 32 * per].reshape(32, per).mean(1)
    np.testing.assert_allclose(np.exp(y[0]) * curves.avg[0, 9], raw, rtol=1e-9)


def test_cumulative_loss_interpolates_linearly_from_zero(curves):
    b = curves.batch_size[:1]
    knots = np.array([[0.0, 0.5, 1.0, 2.5]]) * b
    c = cumulative_loss(curves.avg[:1], b, knots)
    l1, l2, l3 = curves.losses[0, :3]
    np.testing.assert_allclose(c[0] / b[0], [0, 0.5 * l1, l1, l1 + l2 + 0.5 * l3], rtol=1e-12)
    with pytest.raises(ValueError, match="outside"):
        cumulative_loss(curves.avg[:1], b, np.array([[curves.cap * b[0] + 1.0]]))


def test_thinning_keeps_first_recent_and_order():
    table, counts = thinning_table(300, 24, 12)
    for n in (1, 4, 24, 25, 100, 300):
        kept = table[n, : counts[n]]
        assert counts[n] == min(n, counts[n]) and counts[n] <= 24
        assert kept[0] == 0 and kept[-1] == n - 1
        assert np.all(np.diff(kept) > 0)
        if n > 24:
            np.testing.assert_array_equal(kept[-12:], np.arange(n - 12, n))
        else:
            assert counts[n] == n


def test_history_features_ignore_padding_and_match_definition(curves):
    avg, b, n = curves.avg[:3].copy(), curves.batch_size[:3], np.array([4, 20, 200])
    feats, counts = history_features(avg, n, b, 24, 12)
    padded = avg.copy()
    for i, length in enumerate(n):
        padded[i, length:] = np.nan
    feats2, _ = history_features(padded, n, b, 24, 12)
    np.testing.assert_array_equal(feats, feats2)
    f = feats[1, : counts[1]]  # n = 20: every point kept
    np.testing.assert_allclose(f[:, 0], np.log(np.arange(1, 21) * b[1]))
    np.testing.assert_allclose(f[:, 1], np.log(avg[1, :20] / avg[1, 19]))
    np.testing.assert_allclose(f[0, 2:], 0.0)
    np.testing.assert_allclose(f[1:, 2:], np.diff(f[:, :2], axis=0))
    assert f[-1, 1] == 0.0


def test_interval_mean_feature_is_the_mean_batch_loss_between_kept_points(curves):
    """The 5th feature recovers the per-batch losses the cumulative averages hide: at each kept
    point, the mean loss since the previous kept point (at least the last W batches), over
    L_cur; the other four features are unchanged and padding stays finite."""
    avg, b, n = curves.avg[:2], curves.batch_size[:2], np.array([9, 200])
    plain, _ = history_features(avg, n, b, 12, 6)
    feats, counts = history_features(avg, n, b, 12, 6, interval_window=1)
    np.testing.assert_array_equal(feats[..., :4], plain)
    assert np.isfinite(feats).all()
    np.testing.assert_allclose(np.exp(feats[0, :9, 4]) * avg[0, 8], curves.losses[0, :9], rtol=1e-9)
    kept = thinning_table(curves.cap, 12, 6)[0][200]
    gaps = [curves.losses[1, a + 1 : c + 1].mean() for a, c in zip(kept[:-1], kept[1:], strict=True)]
    np.testing.assert_allclose(np.exp(feats[1, 1:counts[1], 4]) * avg[1, 199], gaps, rtol=1e-9)
    wide, _ = history_features(avg, n, b, 12, 6, interval_window=16)
    windows = [curves.losses[1, max(min(a + 1, c + 1 - 16), 0) : c + 1].mean()
               for a, c in zip(kept[:-1], kept[1:], strict=True)]
    np.testing.assert_allclose(np.exp(wide[1, 1:counts[1], 4]) * avg[1, 199], windows, rtol=1e-9)


def test_crossing_interpolates_and_caps():
    paths = np.array([[[1.0, 0.8, 0.6, 0.4], [1.0, 0.95, 0.9, 0.85], [1.0, 0.7, 0.7, 0.7]]])
    r = crossing_batches(paths, np.array([0.7]), np.array([6.0]))
    # boundaries 2 batches apart: halfway between s_1 and s_2; never → h/B; exactly at s_1
    np.testing.assert_allclose(r, [[3.0, 6.0, 2.0]])


def test_standardizer_round_trip():
    x = np.random.default_rng(1).normal(3.0, 2.0, size=(500, 5))
    st = Standardizer.fit(x)
    np.testing.assert_allclose(st.apply(x).mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(st.invert(st.apply(x)), x)
    np.testing.assert_allclose(Standardizer.from_json(st.to_json()).mean, st.mean)
