"""Experiments are created by the project, with the store's artifact folder and the model-training kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mlflow

from mara_common.tracking import (
    ARTIFACT_ROOT,
    DEFAULT_TRACKING_URI,
    KIND,
    KIND_TAG,
    artifact_root,
    ensure_experiment,
    mlflow_run,
)


def test_the_artifact_folder_follows_the_store():
    assert artifact_root(DEFAULT_TRACKING_URI) == ARTIFACT_ROOT  # the default store: the checkout's folder
    assert artifact_root("sqlite:////srv/mara/runs.db") == Path("/srv/mara/mlartifacts")
    assert artifact_root("http://127.0.0.1:5000") is None  # a server decides for itself


def test_experiment_keeps_the_stores_artifact_folder_whatever_the_cwd(mlflow_store, tmp_path, monkeypatch):
    """A Ray job runs from a temporary copy of the project: the experiment it creates (or
    finds) must keep its artifacts beside the store it writes to, not in that copy."""
    store_dir = Path(mlflow_store.removeprefix("sqlite:///")).parent
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    experiment_id = ensure_experiment("mara-test")
    experiment = mlflow.MlflowClient(mlflow_store).get_experiment(experiment_id)
    assert experiment.artifact_location == (store_dir / "mlartifacts" / "mara-test").as_uri()
    assert experiment.tags[KIND_TAG] == KIND
    assert ensure_experiment("mara-test") == experiment_id  # found, not created again
    with mlflow_run("mara-test", "a run") as run:
        assert run.info.artifact_uri.startswith((store_dir / "mlartifacts" / "mara-test").as_uri())


def test_a_private_store_writes_nothing_into_the_checkout(mlflow_store, tmp_path):
    def checkout_files() -> set[Path]:
        return set(ARTIFACT_ROOT.rglob("*")) if ARTIFACT_ROOT.exists() else set()

    before = checkout_files()
    note = tmp_path / "note.txt"
    note.write_text("an artifact")
    with mlflow_run("mara-private", "a run") as run:
        mlflow.log_artifact(str(note))
    assert checkout_files() == before
    assert not (ARTIFACT_ROOT / "mara-private").exists()
    assert (tmp_path / "mlartifacts" / "mara-private" / run.info.run_id / "artifacts" / "note.txt").exists()


def test_an_older_experiment_is_marked_as_model_training(mlflow_store):
    client = mlflow.MlflowClient(mlflow_store)
    experiment_id = client.create_experiment("mara-old")
    assert KIND_TAG not in client.get_experiment(experiment_id).tags
    assert ensure_experiment("mara-old") == experiment_id
    assert client.get_experiment(experiment_id).tags[KIND_TAG] == KIND


def test_runs_started_together_on_a_new_store_all_get_its_experiment(tmp_path):
    """Each process opening a new SQLite store migrates its schema; without taking turns,
    one of several started at once fails."""
    store = f"sqlite:///{tmp_path / 'new.db'}"
    code = ("import sys; from mara_common.tracking import ensure_experiment; "
            "print(ensure_experiment('mara-together', sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, store], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1  # one experiment, found by all
    assert len(mlflow.MlflowClient(store).search_experiments(filter_string="name = 'mara-together'")) == 1
