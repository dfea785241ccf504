"""MLflow set-up shared by every stage.

The default store is an embedded SQLite file at the project root
(`mlflow.db`), with artifacts under `mlartifacts/`; any
`MLFLOW_TRACKING_URI` (an `mlflow server`, another database) takes
precedence, so runs from every stage land side by side. Experiments are
created here, explicitly: with an artifact folder that follows the store
(`<dir>/mlartifacts/<experiment>` beside a `sqlite:///<dir>/<file>.db`,
so a Ray job running from a temporary copy of the project still writes
where the store is, and a test's private store writes nothing into the
checkout; a server decides for itself), and marked as model-training
experiments so that the UI opens on their runs.

Processes that open a SQLite store take turns while they create it and its
experiments (a lock file beside the database): two runs started together on a
new store would otherwise both migrate its schema, and one would fail.
"""

from __future__ import annotations

import fcntl
import functools
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mara_common.config import ConfigError
from mara_common.paths import PROJECT_ROOT

DEFAULT_TRACKING_URI = f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"
ARTIFACT_ROOT = PROJECT_ROOT / "mlartifacts"  # the default store's (see `artifact_root`)
# The UI opens an experiment of this kind on its runs table, not on GenAI traces.
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
REACH_TIMEOUT_S = 5.0


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


@functools.lru_cache(maxsize=8)
def check_reachable(uri: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Fail fast, with the address, when a tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except OSError as exc:
        raise ConfigError(f"MLflow tracking server {uri} did not answer within {timeout_s:g} s ({exc}); "
                          "start it or point MLFLOW_TRACKING_URI elsewhere") from None


def sqlite_file(uri: str) -> Path | None:
    """The database file of a `sqlite:///<path>` store, None for any other store."""
    if not uri.startswith("sqlite:///"):
        return None
    db = uri.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(db).expanduser().resolve() if db and db != ":memory:" else None


def artifact_root(uri: str) -> Path | None:
    """Where the experiments of store `uri` keep their artifacts: `<dir>/mlartifacts` beside a
    `sqlite:///<dir>/<file>.db` (`ARTIFACT_ROOT` for the default store), None (the server's
    choice) for a tracking server, `ARTIFACT_ROOT` for any other store."""
    if uri.startswith(("http://", "https://", "databricks")):
        return None
    db = sqlite_file(uri)
    return db.parent / "mlartifacts" if db is not None else ARTIFACT_ROOT


@contextmanager
def store_lock(uri: str) -> Iterator[None]:
    """Exclusive use of a SQLite store's `<file>.lock` (nothing for other stores)."""
    db = sqlite_file(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """The id of experiment `name` in store `uri` (default: the configured one), created with
    the store's artifact folder (`artifact_root`) and the model-training kind if it does not
    exist yet."""
    import mlflow

    uri = uri or tracking_uri()
    check_reachable(uri)
    with store_lock(uri):
        client = mlflow.MlflowClient(uri)
        found = client.get_experiment_by_name(name)  # opens the store: creates or migrates it
        if found is not None:
            if found.tags.get(KIND_TAG) != KIND:
                client.set_experiment_tag(found.experiment_id, KIND_TAG, KIND)
            return found.experiment_id
        root = artifact_root(uri)
        location = (root / name).as_uri() if root is not None else None
        return client.create_experiment(name, artifact_location=location, tags={KIND_TAG: KIND})


def holds_run(run_id: str, uri: str | None = None) -> bool:
    """Whether store `uri` (default: the configured one) holds run `run_id`."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = uri or tracking_uri()
    check_reachable(uri)
    try:
        mlflow.MlflowClient(uri).get_run(run_id)
    except MlflowException:
        return False
    return True


@contextmanager
def mlflow_run(experiment: str, run_name: str | None = None, tags: dict[str, Any] | None = None,
               run_id: str | None = None, nested: bool = False) -> Iterator[Any]:
    """Start (or resume, with `run_id`) a run in `experiment` on the configured store. A training
    resumed under a store that does not hold its `run_id` (a job logging elsewhere) goes on in a
    new run there, tagged `resumed_from_run` with the one it continues."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment_id=ensure_experiment(experiment))
    if run_id is not None and not holds_run(run_id):
        tags, run_id = {**(tags or {}), "resumed_from_run": run_id}, None
    with mlflow.start_run(run_id=run_id, run_name=run_name, nested=nested,
                          tags={k: str(v) for k, v in (tags or {}).items()}) as run:
        yield run
