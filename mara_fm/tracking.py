"""MLflow set-up shared by every stage.

The default store is an embedded SQLite file at the project root
(`mlflow.db`); any `MLFLOW_TRACKING_URI` (an `mlflow server`, another
database) takes precedence, so runs from both stages land side by side.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mara_fm.profile import PROJECT_ROOT

DEFAULT_TRACKING_URI = f"sqlite:///{PROJECT_ROOT / 'mlflow.db'}"


def tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


@contextmanager
def mlflow_run(experiment: str, run_name: str | None = None, tags: dict[str, Any] | None = None,
               run_id: str | None = None, nested: bool = False) -> Iterator[Any]:
    """Start (or resume, with `run_id`) a run in `experiment` on the configured store."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_id=run_id, run_name=run_name, nested=nested,
                          tags={k: str(v) for k, v in (tags or {}).items()}) as run:
        yield run
