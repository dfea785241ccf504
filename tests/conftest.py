"""Shared fixtures: the smoke bank (real training runs, built once per machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mara_fm.build_bank import BankConfig, ensure_bank
from mara_fm.profile import PROJECT_ROOT, section_config

SMOKE_BANK = PROJECT_ROOT / "data" / "banks" / "smoke.parquet"


@pytest.fixture(scope="session")
def smoke_bank() -> Path:
    return ensure_bank(section_config(BankConfig, "smoke", "bank"), SMOKE_BANK, progress=False)


@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A private embedded MLflow store for one test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
