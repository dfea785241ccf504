"""Experiments are created by the project, with the project's artifact folder and kind."""

from __future__ import annotations

import mlflow

from mara_common.tracking import ARTIFACT_ROOT, KIND, KIND_TAG, ensure_experiment, mlflow_run


def test_experiment_keeps_the_projects_artifact_folder_whatever_the_cwd(mlflow_store, tmp_path, monkeypatch):
    """A Ray job runs from a temporary copy of the project: the experiment it creates (or
    finds) must still keep its artifacts in this checkout's folder, not in that copy."""
    monkeypatch.chdir(tmp_path)
    experiment_id = ensure_experiment("mara-test")
    experiment = mlflow.MlflowClient(mlflow_store).get_experiment(experiment_id)
    assert experiment.artifact_location == (ARTIFACT_ROOT / "mara-test").as_uri()
    assert experiment.tags[KIND_TAG] == KIND
    assert ensure_experiment("mara-test") == experiment_id  # found, not created again
    with mlflow_run("mara-test", "a run") as run:
        assert run.info.artifact_uri.startswith((ARTIFACT_ROOT / "mara-test").as_uri())


def test_an_older_experiment_is_marked_as_model_training(mlflow_store):
    client = mlflow.MlflowClient(mlflow_store)
    experiment_id = client.create_experiment("mara-old")
    assert KIND_TAG not in client.get_experiment(experiment_id).tags
    assert ensure_experiment("mara-old") == experiment_id
    assert client.get_experiment(experiment_id).tags[KIND_TAG] == KIND
