"""Stage-one training on the smoke bank: learning, resume, MLflow, evaluation and the CLI."""

from __future__ import annotations

import argparse
import json
import shutil

import numpy as np
import pytest
import torch

from mara_common.config import ConfigError
from mara_common.profile import Profile
from mara_fm.bank import load_bank, select
from mara_fm.commands import register
from mara_fm.fm_model import PredictorConfig
from mara_fm.predictors.base import HistoryBatch
from mara_fm.predictors.fm import FMPredictor
from mara_fm.predictors.recall import load_memory
from mara_fm.train_predictor import EXPERIMENT, INPUTS_FILE, check_inputs, train_predictor


@pytest.fixture(scope="module")
def trained(smoke_bank, tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        result = train_predictor("smoke", smoke_bank, root / "out", resume=False, verbose=False)
        yield result, root, mp


def test_smoke_training_learns(trained, smoke_bank):
    result, _, _ = trained
    first, last = result.history[0], result.history[-1]
    assert last["val/loss"] < first["val/loss"]
    best = min(h["val/mae"] for h in result.history)
    assert best < result.constant_val["capped_mae"]
    chosen = next(r for r in result.sampling if r["chosen"])
    assert chosen["capped_mae"] < result.constant_val["capped_mae"]
    fm = FMPredictor.load(result.predictor_path)
    assert (fm.cfg.samples, fm.cfg.euler_steps) == (chosen["samples"], chosen["euler_steps"])
    # Beside the weights, the real curves it trained on: the recall predictor's memory.
    memory = load_memory(result.predictor_path)
    assert sorted(memory.ids) == sorted(select(load_bank(smoke_bank), "id", "train").ids)


def test_mlflow_run_holds_params_metrics_and_predictor(trained):
    import mlflow

    result, _, _ = trained
    run = mlflow.get_run(result.run_id)
    assert run.data.params["n_boundaries"] == "32"
    assert {"val_loss", "val_mae", "train_loss", "constant_val_capped_mae"} <= set(run.data.metrics)
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(result.run_id, "val_mae")) == len(result.history)
    names = {a.path for a in client.list_artifacts(result.run_id, "predictor")}
    assert {"predictor/config.json", "predictor/weights.pt"} <= names


def test_resume_continues_from_last_checkpoint(trained, smoke_bank):
    result, root, _ = trained
    epochs = len(result.history)
    # The inference backend is not an input of training: changing it resumes too.
    again = train_predictor("smoke", smoke_bank, root / "out", resume=True, verbose=False,
                            max_epochs=epochs + 1, inference="numpy")
    assert [h["epoch"] for h in again.history] == [epochs]
    assert again.run_id == result.run_id
    assert FMPredictor.load(again.predictor_path).numpy_flow is not None


def test_a_resume_under_another_store_starts_a_run_there(trained, smoke_bank, tmp_path, monkeypatch):
    import mlflow

    result, root, _ = trained
    shutil.copytree(root / "out", tmp_path / "out")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    again = train_predictor("smoke", smoke_bank, tmp_path / "out", verbose=False)
    moved = mlflow.MlflowClient(other).get_run(again.run_id)
    assert again.run_id != result.run_id and moved.data.tags["resumed_from_run"] == result.run_id
    assert moved.data.params["n_boundaries"] == "32" and "chosen_val_mae" in moved.data.metrics
    assert (tmp_path / "out" / "mlflow_run_id").read_text().strip() == again.run_id


def test_interval_mean_inputs_train_and_travel_with_the_export(trained, smoke_bank, tmp_path):
    """With `interval_window` the network reads five features per point, in training and in
    the exported predictor, which says so in its config."""
    result = train_predictor("smoke", smoke_bank, tmp_path / "out", resume=False, verbose=False,
                             max_epochs=2, interval_window=16)
    fm = FMPredictor.load(result.predictor_path)
    assert fm.cfg.interval_window == 16
    assert fm.model.encoder.gru.input_size == 5 and fm.stats.history.mean.shape == (5,)
    assert result.history[-1]["val/loss"] < result.history[0]["val/loss"]
    with pytest.raises(ValueError, match="interval_window must be ≥ 0"):
        PredictorConfig(interval_window=-1)


def test_without_lr_input_the_forecast_ignores_the_learning_rate(trained, smoke_bank, tmp_path):
    """`lr_input = False`: the context reads three static features, and two runs that differ
    only in their learning rate get the same forecast; with it, the context tells them apart."""
    result = train_predictor("smoke", smoke_bank, tmp_path / "out", resume=False, verbose=False,
                             max_epochs=1, lr_input=False)
    fm = FMPredictor.load(result.predictor_path)
    assert not fm.cfg.lr_input and fm.stats.static.mean.shape == (3,)
    assert fm.model.context[0].in_features == fm.cfg.gru_hidden + 3
    avg = np.tile(1.0 / np.sqrt(np.arange(1.0, 41.0)), (2, 1))
    hist = HistoryBatch(avg=avg, lengths=np.array([20, 20]), batch_size=np.array([32, 32]),
                        lr=np.array([1e-3, 1e-1]))
    eps, horizon = np.array([0.2, 0.2]), np.array([200.0, 200.0])
    assert torch.equal(*fm.encode(hist, horizon)[2])
    forecast = fm.remaining_batches(hist, eps, horizon)  # equal up to float32 rounding by batch row
    assert forecast[0] == pytest.approx(forecast[1], rel=1e-6)
    with_lr = FMPredictor.load(trained[0].predictor_path)
    assert with_lr.cfg.lr_input and with_lr.stats.static.mean.shape == (4,)
    static = with_lr.encode(hist, horizon)[2]
    assert not torch.equal(static[0], static[1])


def test_a_setting_added_since_a_run_resumes_at_its_default_only(trained, tmp_path):
    """A run recorded before a PredictorConfig field existed resumes while the field keeps its
    default; set otherwise, the checkpoint was fitted to something else and is refused."""
    _, root, _ = trained
    stored = json.loads((root / "out" / INPUTS_FILE).read_text())
    inputs = json.loads(json.dumps(stored))
    del stored["config"]["interval_window"]
    shutil.copytree(root / "out" / "checkpoints", tmp_path / "checkpoints")
    (tmp_path / INPUTS_FILE).write_text(json.dumps(stored))
    check_inputs(tmp_path, inputs)
    inputs["config"]["interval_window"] = 16
    with pytest.raises(ConfigError, match="interval_window"):
        check_inputs(tmp_path, inputs)


def test_eval_command_writes_report(trained, smoke_bank, tmp_path):
    result, _, _ = trained
    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile")
    register(parser.add_subparsers(dest="command"), common)
    args = parser.parse_args(["eval-predictor", "--profile", "smoke", "--bank", str(smoke_bank),
                              "--predictor-path", str(result.predictor_path), "--out", str(tmp_path)])
    args.profile = Profile.load(args.profile)  # as `mara` does, once, before any command
    args.func(args)
    records = json.loads((tmp_path / "predictor_eval.json").read_text())
    assert {(r["task_set"], r["predictor"]) for r in records} == {
        (t, p) for t in ("id", "rl_ood", "vit_ood") for p in ("fm", "recall", "wls")}
    # The smoke memory holds 4 runs of each kind, fewer than FM's samples: recall is FM throughout.
    scores = {(r["task_set"], r["predictor"]): r["capped_mae"] for r in records}
    assert all(scores[(t, "recall")] == scores[(t, "fm")] for t in ("id", "rl_ood", "vit_ood"))
    m = next(r["samples"] for r in records if r["predictor"] == "fm")
    for r in records:
        assert r["n_queries"] > 0 and r["ms_per_prefix"] > 0 and len(r["mae_by_rank"]) == 8
        shares = r["reliability"]
        assert len(shares) == m and 0 <= shares[0] and shares[-1] <= 1
        assert all(a <= b for a, b in zip(shares, shares[1:], strict=False))
        assert r["crps"] >= 0 and 0 <= r["calibration_max_dev"] <= 1
    assert all("mae_reduction_vs_wls" in r for r in records if r["predictor"] == "fm")
    for name in ("predictor_eval.md", "forecast_example.png", "mae_by_rank.png", "reliability.png"):
        assert (tmp_path / name).stat().st_size > 0
    import mlflow

    runs = mlflow.search_runs(experiment_names=[EXPERIMENT], filter_string="tags.stage = 'eval'")
    assert len(runs) == 1 and "metrics.id.fm.capped_mae" in runs.columns
    assert {"metrics.id.fm.crps", "metrics.vit_ood.wls.calibration_max_dev"} <= set(runs.columns)


def test_train_command_parses_overrides():
    parser = argparse.ArgumentParser()
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile")
    register(parser.add_subparsers(dest="command"), common)
    args = parser.parse_args(["train-predictor", "--profile", "smoke", "--fresh", "--max-epochs", "3"])
    assert args.fresh and args.max_epochs == 3 and args.func.__name__ == "cmd_train_predictor"
