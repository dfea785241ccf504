"""The recall predictor: FM's training runs as a memory, read by the kind the prefix reveals."""

import dataclasses

import numpy as np
import pytest

from mara_env.env import load_curves
from mara_fm.bank import CurveSet
from mara_fm.predictors import HistoryBatch, HistoryPredictor, make_predictor, predictor_digest
from mara_fm.predictors.fm import ArtifactError, FMPredictor
from mara_fm.predictors.recall import (
    MEMORY_FILE,
    KindReader,
    RecallConfig,
    RecallPredictor,
    load_memory,
    prefix_features,
    save_memory,
)

M = 4  # samples of the FM these tests use: the smoke bank holds 5 train and val runs per kind


@pytest.fixture(scope="module")
def parts(smoke_bank, untrained_fm):
    train, val = load_curves(smoke_bank, "id", "train"), load_curves(smoke_bank, "id", "val")
    memory = CurveSet(*(np.concatenate([getattr(train, f), getattr(val, f)])
                        for f in ("ids", "families", "batch_size", "lr", "losses")))
    fm = FMPredictor(untrained_fm.model, dataclasses.replace(untrained_fm.cfg, samples=M), untrained_fm.stats)
    test = load_curves(smoke_bank, "id", "test")
    rng = np.random.default_rng(0)
    rows = np.repeat(np.arange(len(test)), 6)
    lengths = rng.integers(8, 150, len(rows))
    hist = HistoryBatch.from_curves(test.avg[rows], lengths, test.batch_size[rows], test.lr[rows])
    hist = dataclasses.replace(hist, future=None)
    eps = test.avg[rows, np.minimum(lengths + rng.integers(5, 140, len(rows)), test.cap - 1)]
    horizon = (test.cap - lengths).astype(np.float64)
    return memory, fm, hist, eps, horizon, test.families[rows]


def test_the_gates_send_a_task_to_the_memory_or_to_fm(parts):
    memory, fm, hist, eps, horizon, _ = parts
    reader = KindReader(memory)
    closed = RecallPredictor(memory, fm, RecallConfig(max_shift=0.0, max_distance=0.0), reader)
    np.testing.assert_array_equal(closed.remaining_batches(hist, eps, horizon),
                                  fm.remaining_batches(hist, eps, horizon))
    # Wide open, its samples are the M runs the history predictor finds when told the kind it
    # recognised; a run that never gets there reports the horizon, as an FM sample does.
    opened = RecallPredictor(memory, fm, RecallConfig(max_shift=np.inf, max_distance=np.inf), reader)
    match = opened.match(hist)
    assert opened.answered(match).all() and match.near.shape == match.moved.shape == (len(hist), M)
    told = dataclasses.replace(hist, kind=match.kinds)
    history = HistoryPredictor(memory, neighbours=M).sorted_crossings(told, eps, horizon)
    np.testing.assert_allclose(opened.sorted_crossings(hist, eps, horizon), np.minimum(history, horizon[:, None]))
    mine = opened.remaining_batches(hist, eps, horizon)
    assert ((mine > 0) & (mine < horizon)).sum() > 10
    band = opened.remaining_batches(hist, eps, horizon, optimistic=0.0)  # the fastest of the M runs
    assert (np.where(np.isinf(band[:, 1]), band[:, 0] == horizon, band[:, 1] <= band[:, 0])).all()
    # In between, each task follows its own gate.
    middle = RecallPredictor(memory, fm, RecallConfig(max_shift=float(np.median(match.shift)),
                                                      max_distance=np.inf), reader)
    some = middle.answered(middle.match(hist))
    assert some.any() and not some.all()
    np.testing.assert_allclose(middle.remaining_batches(hist, eps, horizon),
                               np.where(some, mine, fm.remaining_batches(hist, eps, horizon)))


def test_the_kind_reader_names_the_nearest_runs_kind_at_the_same_length(parts):
    memory, _, hist, _, _, kinds = parts
    reader = KindReader(memory)
    # A memory run's own prefix is at distance 0 from itself: it names the run's kind.
    rows = np.arange(len(memory))
    lengths = np.random.default_rng(2).integers(4, memory.cap, len(memory))
    own = HistoryBatch.from_curves(memory.avg[rows], lengths, memory.batch_size[rows], memory.lr[rows])
    np.testing.assert_array_equal(reader(own), memory.families)
    table, mean, scale = reader.table(50)
    assert table.shape == (len(memory), prefix_features(own).shape[1]) and (scale > 0).all()
    # On runs it has never seen, of kinds it knows, it names the kind far above chance (1 in 8).
    assert np.mean(reader(hist) == kinds) > 0.5


def test_the_memory_travels_with_the_export_and_is_checked(parts, tmp_path):
    memory, fm, hist, eps, horizon, _ = parts
    folder = fm.export(tmp_path / "fm")
    with pytest.raises(ArtifactError, match="recall memory not found"):
        make_predictor(f"recall:{folder}")
    save_memory(memory, folder)
    loaded = make_predictor(f"recall:{folder}")
    assert isinstance(loaded, RecallPredictor) and loaded.samples == M
    np.testing.assert_array_equal(load_memory(folder).losses, memory.losses)
    assert loaded.remaining_batches(hist, eps, horizon).shape == (len(hist),)
    before = predictor_digest(f"recall:{folder}")
    assert predictor_digest(f"fm:{folder}") != before
    broken = dataclasses.replace(memory, losses=np.where(np.arange(memory.cap) == 3, np.nan, memory.losses))
    save_memory(broken, folder)
    assert predictor_digest(f"recall:{folder}") != before
    with pytest.raises(ArtifactError, match="non-finite"):
        load_memory(folder)
    (folder / MEMORY_FILE).write_text("not an archive")
    with pytest.raises(ArtifactError, match="not a readable recall memory"):
        load_memory(folder)


def test_a_kind_with_fewer_runs_than_samples_is_left_to_fm(parts, untrained_fm):
    memory, _, hist, eps, horizon, _ = parts
    opened = RecallPredictor(memory, untrained_fm, RecallConfig(max_shift=np.inf, max_distance=np.inf))
    assert untrained_fm.samples == 8 and not opened.recallable  # 5 runs of each smoke kind
    assert not opened.answered(opened.match(hist)).any()
    np.testing.assert_array_equal(opened.remaining_batches(hist, eps, horizon),
                                  untrained_fm.remaining_batches(hist, eps, horizon))
    with pytest.raises(ValueError, match="max_shift, max_distance and max_novelty"):
        RecallConfig(max_shift=-1.0)


def test_the_novelty_gate_admits_only_prefixes_like_a_memory_run(parts):
    memory, fm, hist, eps, horizon, _ = parts
    reader = KindReader(memory)
    kinds, novelty = reader.read(hist)
    np.testing.assert_array_equal(kinds, reader(hist))
    rows, lengths = np.arange(len(memory)), np.full(len(memory), 60)
    own = HistoryBatch.from_curves(memory.avg[rows], lengths, memory.batch_size[rows], memory.lr[rows])
    np.testing.assert_allclose(reader.read(own)[1], 0.0, atol=1e-12)  # each run is its own nearest
    limit = float(np.median(novelty))
    gated = RecallPredictor(memory, fm, RecallConfig(max_shift=np.inf, max_distance=np.inf, max_novelty=limit), reader)
    match = gated.match(hist)
    np.testing.assert_array_equal(gated.answered(match), novelty <= limit)
    with pytest.raises(ValueError, match="max_novelty"):
        RecallConfig(max_novelty=-1.0)


def test_the_probes_gate_scores_are_the_predictors_own(parts, smoke_bank):
    from experiments.probes.recall_probe import gate_scores
    from mara_fm.eval_predictor import make_queries, reference_curves, score

    memory, fm, *_ = parts
    test = load_curves(smoke_bank, "id", "test")
    q = make_queries(test, reference_curves(test, None))
    gates = [RecallConfig(), RecallConfig(max_shift=np.inf, max_distance=np.inf), RecallConfig(max_novelty=0.05)]
    for cfg, (mae, share) in zip(gates, gate_scores(memory, fm, q, gates), strict=True):
        predictor = RecallPredictor(memory, fm, cfg)
        assert mae == pytest.approx(score(predictor.remaining_batches(q.hist, q.eps, q.horizon), q)["capped_mae"])
        assert share == pytest.approx(predictor.answered(predictor.match(q.hist)).mean())
