import dataclasses

import numpy as np
import pytest

from mara_common.config import ConfigError
from mara_common.profile import Profile
from mara_env.env import load_curves
from mara_fm.bank import curve_set, load_bank, save_bank
from mara_fm.build_bank import bank_spec, ensure_history_bank
from mara_fm.eval_predictor import QueryConfig, bank_query_sets, evaluate
from mara_fm.predictors import (
    HistoryBatch,
    HistoryPredictor,
    OraclePredictor,
    WLSPredictor,
    make_predictor,
    predictor_digest,
)


def power_law(n_points, batch_size=32, a=2.0, b=0.3):
    s = np.arange(1, n_points + 1) * batch_size
    return a * s ** (-b)


def test_wls_recovers_an_exact_power_law_crossing():
    curve = power_law(300)
    eps = curve[199]  # reached exactly at batch 200
    hist = HistoryBatch.from_curves(curve[None, :], np.array([50]), np.array([32]), np.array([1e-3]))
    est = WLSPredictor().remaining_batches(hist, np.array([eps]), np.array([250.0]))
    assert est[0] == pytest.approx(150, abs=0.05)  # only the tiny ridge biases it


def test_wls_never_crossing_returns_horizon():
    flat = np.linspace(1.0, 1.2, 300)  # increasing loss: b <= 0
    hist = HistoryBatch.from_curves(flat[None, :], np.array([20]), np.array([16]), np.array([1e-3]))
    assert WLSPredictor().remaining_batches(hist, np.array([0.5]), np.array([280.0]))[0] == 280.0


def test_warmup_rule_and_already_crossed():
    curve = power_law(300)
    hist = HistoryBatch.from_curves(np.stack([curve] * 3), np.array([3, 10, 10]),
                                    np.full(3, 32), np.full(3, 1e-3))
    eps = np.array([curve[100], curve[100], curve[5]])
    est = WLSPredictor().remaining_batches(hist, eps, np.array([297.0, 290.0, 290.0]))
    assert est[0] == 297.0  # fewer than 4 points: the remaining cap
    assert est[2] == 0.0  # already at the threshold


@pytest.mark.parametrize("optimistic", [None, 0.15])
def test_an_empty_batch_gets_an_empty_answer(untrained_fm, optimistic):
    empty = HistoryBatch(np.zeros((0, 1)), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0),
                         future=np.zeros((0, 300)))
    for predictor in (WLSPredictor(), OraclePredictor(), untrained_fm):
        est = predictor.remaining_batches(empty, np.zeros(0), np.zeros(0), optimistic)
        assert est.shape == ((0,) if optimistic is None else (0, 2))


def test_oracle_reads_the_true_future_and_learned_predictors_do_not():
    curve = power_law(300)
    curve[150:] = curve[149]  # plateau: never reaches deeper thresholds
    hist = HistoryBatch.from_curves(curve[None, :], np.array([10]), np.array([32]), np.array([1e-3]))
    oracle = OraclePredictor().remaining_batches(hist, np.array([curve[99]]), np.array([290.0]))
    assert oracle[0] == 90.0
    assert np.isnan(hist.avg[0, 10:]).all() and hist.avg.shape[1] == 10
    never = OraclePredictor().remaining_batches(hist, np.array([0.01]), np.array([290.0]))
    assert never[0] == 290.0


def test_make_predictor_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown predictor"):
        make_predictor("magic")
    with pytest.raises(ValueError, match="gamma"):
        WLSPredictor(gamma=1.5)


@pytest.mark.parametrize("name", ["wls", "oracle"])
def test_replaying_a_curve_set_matches_predicting_from_prefixes(smoke_bank, name):
    """The simulator's path (WLS: fits tabulated once per curve set) gives the same answers."""
    curves = load_curves(smoke_bank, "id", "train")
    rng = np.random.default_rng(0)
    rows = rng.integers(0, len(curves), 64)
    lengths = rng.integers(1, curves.cap, 64)
    eps = curves.avg[rows, rng.integers(0, curves.cap, 64)]
    eps[:8] = curves.avg[rows[:8]].min(axis=1) / 2  # thresholds these runs never reach
    horizon = (curves.cap - lengths).astype(np.float64)
    predictor = make_predictor(name)
    hist = HistoryBatch.from_curves(curves.avg[rows], lengths, curves.batch_size[rows], curves.lr[rows])
    direct = predictor.remaining_batches(hist, eps, horizon)
    replayed = predictor.replay_remaining(curves, rows, lengths, eps, horizon)
    assert (direct == 0).any() and ((direct > 0) & (direct < horizon)).any()  # both regimes exercised
    np.testing.assert_allclose(replayed, direct, rtol=1e-6, atol=1e-6)
    # A point predictor's optimistic band is its estimate, on either path, except that a
    # task past warm-up that the estimate never brings to ε within the horizon gets inf.
    never = (direct == horizon) & (lengths >= 4) & (hist.current > eps)
    assert never.any() and (~never).any()
    for band in (predictor.remaining_batches(hist, eps, horizon, optimistic=0.15),
                 predictor.replay_remaining(curves, rows, lengths, eps, horizon, optimistic=0.15)):
        assert band.shape == (64, 2)
        np.testing.assert_allclose(band, np.stack([direct, np.where(never, np.inf, direct)], axis=1),
                                   rtol=1e-6, atol=1e-6)


def test_history_with_one_neighbour_that_is_the_task_itself_is_the_oracle(smoke_bank):
    """A pool holding the task's own run (at distance 0) answers its true remaining demand."""
    curves = load_curves(smoke_bank, "id", "test")
    rng = np.random.default_rng(1)
    rows = rng.integers(0, len(curves), 48)
    lengths = rng.integers(4, curves.cap - 20, 48)
    # Just above a point of the curve, so that exp(log(x)) rounding cannot move a crossing.
    eps = curves.avg[rows, np.minimum(lengths + rng.integers(0, 120, 48), curves.cap - 1)] * (1 + 1e-9)
    horizon = (curves.cap - lengths).astype(np.float64)
    truth = OraclePredictor().replay_remaining(curves, rows, lengths, eps, horizon)
    mine = HistoryPredictor(curves, neighbours=1, window=None).replay_remaining(curves, rows, lengths, eps, horizon)
    assert ((truth > 0) & (truth < horizon)).sum() > 10
    np.testing.assert_array_equal(mine, truth)


def test_the_predictor_evaluation_tells_the_history_predictor_each_querys_kind(smoke_bank):
    """Scored on its own runs with one neighbour, the history predictor is exact on every task
    set: the queries (and their subsets, which time it) carry each task's kind."""
    frame = load_bank(smoke_bank)
    records = evaluate({"history": HistoryPredictor(curve_set(frame), neighbours=1), "wls": WLSPredictor()},
                       bank_query_sets(frame, QueryConfig()))
    history = [r for r in records if r["predictor"] == "history"]
    assert sorted(r["task_set"] for r in history) == ["id", "rl_ood", "vit_ood"]
    for r in history:
        assert r["capped_mae"] == pytest.approx(0, abs=0.05) and r["budget_accuracy"] > 0.99
        assert r["mae_reduction_vs_wls"] > 0.95 and r["ms_per_prefix"] > 0
        assert r["crps"] == pytest.approx(r["capped_mae"]) and len(r["reliability"]) == 1  # one neighbour
    # Its samples are its nearest runs' crossings, whose median is its estimate.
    _, q = bank_query_sets(frame, QueryConfig())["id"]
    two = HistoryPredictor(curve_set(frame), neighbours=2)
    samples = two.sorted_crossings(q.hist, q.eps, q.horizon)  # inf: a run that never gets there
    assert samples.shape == (len(q), 2) and (samples[:, 0] <= samples[:, 1]).all()
    assert (samples[:, 0] < samples[:, 1]).any() and np.isinf(samples).any()
    np.testing.assert_allclose(np.minimum(np.median(samples, axis=1), q.horizon),
                               two.remaining_batches(q.hist, q.eps, q.horizon))
    assert HistoryPredictor(curve_set(frame), neighbours=50).samples == min(np.unique(frame["family"], return_counts=True)[1])


def test_history_band_and_what_it_refuses(smoke_bank):
    curves = load_curves(smoke_bank, "id", "test")
    predictor = HistoryPredictor(curves, neighbours=3, window=20)
    rows, lengths = np.arange(len(curves)), np.full(len(curves), 30)
    eps = curves.avg[rows, 120]
    horizon = np.full(len(curves), 250.0)
    band = predictor.replay_remaining(curves, rows, lengths, eps, horizon, optimistic=0.0)
    assert band.shape == (len(curves), 2)
    # The fastest of 3 neighbours comes no later than their median; inf only where the median is out of reach.
    assert np.where(np.isinf(band[:, 1]), band[:, 0] == horizon, band[:, 1] <= band[:, 0]).all()
    assert np.isfinite(band[:, 1]).any()
    unreachable = predictor.replay_remaining(curves, rows, lengths, np.full(len(curves), 1e-9), horizon,
                                             optimistic=0.0)
    assert (unreachable[:, 0] == horizon).all() and np.isinf(unreachable[:, 1]).all()
    hist = HistoryBatch.from_curves(curves.avg[:2], np.array([30, 30]), curves.batch_size[:2], curves.lr[:2])
    with pytest.raises(ValueError, match="job kind"):
        predictor.remaining_batches(hist, eps[:2], horizon[:2])  # a bare prefix carries no kind
    stranger = dataclasses.replace(hist, kind=np.array(["mystery_family"] * 2))
    with pytest.raises(ValueError, match="mystery_family"):
        predictor.remaining_batches(stranger, eps[:2], horizon[:2])


def test_history_spec_loads_a_bank_file_and_its_digest_follows_the_file(smoke_bank, tmp_path):
    frame = load_bank(smoke_bank)
    path = save_bank(frame[frame["task_set"] == "id"], tmp_path / "history.parquet")
    predictor = make_predictor(f"history:{path}")
    assert isinstance(predictor, HistoryPredictor) and len(predictor.pool) == (frame["task_set"] == "id").sum()
    before = predictor_digest(f"history:{path}")
    save_bank(frame[frame["split"] == "train"], path)
    assert predictor_digest(f"history:{path}") != before
    with pytest.raises(FileNotFoundError, match="mara curves --history"):
        make_predictor(f"history:{tmp_path / 'missing.parquet'}")


def test_the_history_bank_must_be_other_runs_than_the_main_banks(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("[bank]\nseed = 3\n[history_bank]\nseed = 3\n")
    with pytest.raises(ConfigError, match="seed 3 is the main bank's"):
        bank_spec(Profile.load(profile), "history")
    assert ensure_history_bank(Profile.load("paper")) is None  # no [history_bank]: no history methods
