"""The FM predictor's inference, artifact format and the eval query protocol."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from mara_common.paths import PROJECT_ROOT
from mara_fm.bank import load_bank, select
from mara_fm.eval_predictor import QueryConfig, make_queries, reference_curves, score
from mara_fm.fm_lightning import FMLightning
from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.fm_numpy import NumpyFlow
from mara_fm.predictors import HistoryBatch, first_crossing, make_predictor
from mara_fm.predictors.fm import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ArtifactError,
    FMPredictor,
    sobol_normals,
)
from mara_fm.targets import history_width, static_width


@pytest.fixture(scope="module")
def frame(smoke_bank):
    return load_bank(smoke_bank)


@pytest.fixture(scope="module")
def predictor(untrained_fm) -> FMPredictor:
    return untrained_fm


@pytest.fixture(scope="module")
def queries(frame):
    test = select(frame, "id", "test")
    return make_queries(test, reference_curves(test, select(frame, "id", "train")))


@pytest.fixture(scope="module")
def exported(predictor, tmp_path_factory):
    return predictor.export(tmp_path_factory.mktemp("fm") / "predictor")


def _ask(pred, q):
    return pred.remaining_batches(q.hist, q.eps, q.horizon)


def test_export_load_round_trip_and_factory(predictor, queries, exported):
    expected = _ask(predictor, queries)
    np.testing.assert_array_equal(_ask(FMPredictor.load(exported), queries), expected)
    np.testing.assert_array_equal(_ask(make_predictor(f"fm:{exported}"), queries), expected)
    assert np.all((expected >= 0) & (expected <= queries.horizon))


def test_warmup_done_and_batch_independence(predictor, queries):
    q = queries
    short = HistoryBatch.from_curves(q.hist.future[:2], np.array([3, 2]), q.hist.batch_size[:2],
                                     q.hist.lr[:2])
    np.testing.assert_array_equal(predictor.remaining_batches(short, q.eps[:2], [50.0, 60.0]), [50, 60])
    assert predictor.remaining_batches(q.hist, np.full(len(q), 1e9), q.horizon).max() == 0
    together = _ask(predictor, q)
    np.testing.assert_array_equal(_ask(predictor, q), together)
    alone = np.array([_ask(predictor, q.subset(np.array([i])))[0] for i in range(0, len(q), 7)])
    np.testing.assert_allclose(alone, together[::7], rtol=1e-4, atol=1e-3)


def test_optimistic_band_is_the_median_and_a_low_sample(predictor, queries):
    """Column 0 is the usual estimate; column 1 the q-quantile of the M sampled crossings,
    clipped like the estimate, or inf where that sample never reaches ε within the horizon;
    warm-up rows get the horizon in both."""
    q = queries
    point = _ask(predictor, q)
    band = predictor.remaining_batches(q.hist, q.eps, q.horizon, optimistic=0.15)
    np.testing.assert_array_equal(band[:, 0], point)
    ready = (q.hist.current > q.eps) & (q.hist.lengths >= 4)
    ordered = predictor.sorted_crossings(q.subset(np.flatnonzero(ready)).hist, q.eps[ready], q.horizon[ready])
    never = ordered[:, 1] >= q.horizon[ready]
    np.testing.assert_allclose(band[ready, 1], np.where(never, np.inf, np.clip(ordered[:, 1], 0, q.horizon[ready])),
                               rtol=1e-5, atol=1e-4)
    # A task whose low sample never crosses has a median that never does either.
    np.testing.assert_array_equal(band[ready][never, 0], q.horizon[ready][never])
    finite = np.isfinite(band[:, 1])
    assert np.all(band[finite, 1] <= band[finite, 0] + 1e-9) and np.any(band[:, 1] < band[:, 0] - 1)
    lowest = predictor.remaining_batches(q.hist, q.eps, q.horizon, optimistic=0.0)[:, 1]
    assert np.all(lowest <= band[:, 1] + 1e-9)
    short = HistoryBatch.from_curves(q.hist.future[:2], np.array([3, 2]), q.hist.batch_size[:2], q.hist.lr[:2])
    np.testing.assert_array_equal(predictor.remaining_batches(short, q.eps[:2], [50.0, 60.0], optimistic=0.15),
                                  [[50, 50], [60, 60]])


def test_same_prefix_same_prediction_in_another_process(queries, exported, tmp_path):
    q = queries
    np.savez(tmp_path / "q.npz", avg=q.hist.avg, lengths=q.hist.lengths, b=q.hist.batch_size,
             lr=q.hist.lr, eps=q.eps, horizon=q.horizon)
    code = (
        "import json, sys, numpy as np\n"
        "from mara_fm.predictors.fm import FMPredictor\n"
        "from mara_fm.predictors import HistoryBatch\n"
        f"d = np.load({str(tmp_path / 'q.npz')!r})\n"
        "h = HistoryBatch(d['avg'], d['lengths'], d['b'], d['lr'])\n"
        f"p = FMPredictor.load({str(exported)!r})\n"
        "print(json.dumps([float(x).hex() for x in p.remaining_batches(h, d['eps'], d['horizon'])]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PROJECT_ROOT, timeout=120)
    other = np.array([float.fromhex(x) for x in json.loads(out.stdout.strip().splitlines()[-1])])
    np.testing.assert_array_equal(other, _ask(FMPredictor.load(exported), q))


def test_sobol_starting_points_are_fixed():
    a, b = sobol_normals(16, 32, 0), sobol_normals(16, 32, 0)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert torch.isfinite(a).all() and a.shape == (16, 32)
    assert not torch.equal(a, sobol_normals(16, 32, 1))


@pytest.mark.parametrize("damage", ["no_folder", "no_weights", "bad_json", "bad_weights", "wrong_shape"])
def test_broken_artifact_names_the_file(exported, tmp_path, damage):
    target = tmp_path / "predictor"
    if damage != "no_folder":
        target.mkdir()
        for f in (CONFIG_FILE, WEIGHTS_FILE):
            (target / f).write_bytes((exported / f).read_bytes())
    culprit = WEIGHTS_FILE if damage in ("no_weights", "bad_weights", "wrong_shape") else CONFIG_FILE
    if damage == "no_weights":
        (target / WEIGHTS_FILE).unlink()
    elif damage == "bad_json":
        (target / CONFIG_FILE).write_text("{not json")
    elif damage == "bad_weights":
        (target / WEIGHTS_FILE).write_bytes(b"\x00garbage")
    elif damage == "wrong_shape":
        meta = json.loads((target / CONFIG_FILE).read_text())
        meta["config"]["width"] = 16
        (target / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ArtifactError, match=culprit):
        FMPredictor.load(target)


def test_query_protocol(frame, queries):
    test = select(frame, "id", "test")
    q = queries
    again = make_queries(test, reference_curves(test, select(frame, "id", "train")))
    np.testing.assert_array_equal(q.eps, again.eps)
    np.testing.assert_array_equal(q.hist.lengths, again.hist.lengths)
    assert len(q) > 8 * len(test) // 2
    assert np.all(q.hist.current > q.eps) and np.all(q.hist.lengths >= 4)
    assert np.all(q.budget >= 1) and np.all(q.budget < q.horizon)
    assert set(np.unique(q.rank)) <= set(range(8))
    np.testing.assert_array_equal(q.horizon, test.cap - q.hist.lengths)
    np.testing.assert_array_equal(q.truth, first_crossing(test.avg[q.curve], q.hist.lengths, q.eps, q.horizon))
    other = make_queries(test, reference_curves(test, select(frame, "id", "train")), QueryConfig(seed=1))
    assert not np.array_equal(other.eps, q.eps)


def test_ood_reference_is_own_median(frame):
    rl = select(frame, "rl_ood", "test")
    ref = reference_curves(rl, None)
    fam = rl.families[0]
    np.testing.assert_allclose(ref[fam], np.median(rl.avg[rl.families == fam], axis=0))
    q = make_queries(rl, ref)
    assert np.all(q.hist.current > q.eps)


def test_score_by_hand(queries):
    q = queries.subset(np.arange(4))
    pred = q.truth + np.array([2.0, -2.0, 0.0, 1e6])
    out = score(pred, q)
    expected = np.abs(np.minimum(pred, q.horizon) - q.truth).mean()
    assert out["capped_mae"] == pytest.approx(expected)
    truth_ok, pred_ok = q.truth <= q.budget, pred <= q.budget
    assert out["budget_accuracy"] == pytest.approx(np.mean(truth_ok == pred_ok))
    assert out["n_queries"] == 4 and len(out["mae_by_rank"]) == 8


@pytest.mark.parametrize("sizes", [dict(gru_hidden=16, context_dim=24, width=32, depth=1),
                                   dict(gru_hidden=64, context_dim=96, width=128, depth=2),
                                   dict(gru_hidden=16, context_dim=24, width=32, depth=1, interval_window=16),
                                   dict(gru_hidden=16, context_dim=24, width=32, depth=1, lr_input=False)])
def test_numpy_network_equals_torch(sizes):
    """NumpyFlow reads the same weights as FlowModel and computes the same context and
    sampled paths, prefixes of every length up to the GRU's window included (and with the
    interval-mean feature, a 5th GRU input, or without log lr among the static inputs)."""
    cfg = PredictorConfig(**sizes)
    torch.manual_seed(1)
    model = FlowModel(cfg).eval()
    gen = torch.Generator().manual_seed(2)
    points = torch.randn(9, cfg.max_points, history_width(cfg.interval_window), generator=gen)
    counts = torch.arange(1, 10).clamp(max=cfg.max_points)
    static = torch.randn(9, static_width(cfg.lr_input), generator=gen)
    z0 = torch.randn(5, cfg.n_boundaries, generator=gen)
    with torch.inference_mode():
        c = model.encode(points, counts, static)
        z = model.sample(c, z0, 3)
    flow = NumpyFlow(model)
    c_np = flow.encode(points.numpy(), counts.numpy(), static.numpy())
    np.testing.assert_allclose(c_np, c.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(flow.sample(c_np, z0.numpy(), 3), z.numpy(), rtol=1e-4, atol=1e-4)


def test_numpy_inference_is_a_loading_choice(predictor, queries, exported, tmp_path):
    q = queries
    on_torch, on_numpy = FMPredictor.load(exported), FMPredictor.load(exported, inference="numpy")
    assert on_torch.numpy_flow is None and on_numpy.numpy_flow is not None
    np.testing.assert_allclose(on_numpy.forecast(q.hist, q.horizon)[1], on_torch.forecast(q.hist, q.horizon)[1],
                               rtol=1e-5)
    np.testing.assert_allclose(_ask(on_numpy, q), _ask(on_torch, q), atol=0.05)
    # The backend travels with the export, and a wrong name is refused with the setting's name.
    assert FMPredictor.load(on_numpy.export(tmp_path / "np")).numpy_flow is not None
    # A network still training validates on torch: a NumPy copy of its weights would go stale.
    training = FMLightning(dataclasses.replace(predictor.cfg, inference="numpy"), predictor.stats)
    assert training.predictor.numpy_flow is None
    with pytest.raises(ValueError, match="PredictorConfig.inference"):
        FMPredictor.load(exported, inference="jax")
