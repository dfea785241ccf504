"""Shared fixtures: the smoke banks (real training runs, built once per machine), a FM
predictor, MLflow; and the session's exit status, kept from a crash in the interpreter's teardown."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch

from mara_common.kernels import pin_kernels
from mara_common.profile import Profile
from mara_fm.bank import load_bank, select
from mara_fm.build_bank import BankConfig, ensure_bank, ensure_wide_bank
from mara_fm.fm_data import fit_stats
from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.predictors import FMPredictor

pin_kernels()  # as the CLI does (if MARA_KERNELS asks), before the tests run any operation
SMOKE_PROFILE = Profile.load("smoke")
SMOKE_BANK = SMOKE_PROFILE.paths.bank


@pytest.fixture(scope="session")
def smoke_bank() -> Path:
    return ensure_bank(SMOKE_PROFILE.section(BankConfig, "bank"), SMOKE_BANK, progress=False)


@pytest.fixture(scope="session")
def smoke_wide_bank() -> Path:
    """The smoke profile's wide bank: a few real runs of each wide family."""
    return ensure_wide_bank(SMOKE_PROFILE, progress=False)


@pytest.fixture(scope="session")
def untrained_fm(smoke_bank) -> FMPredictor:
    """An untrained but complete FM predictor: inference, artifacts and pooling do not depend on training."""
    cfg = PredictorConfig(stats_examples_per_curve=8)
    torch.manual_seed(0)
    stats = fit_stats(select(load_bank(smoke_bank), "id", "train"), cfg)
    return FMPredictor(FlowModel(cfg).eval(), cfg, stats)


@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch) -> str:
    """A private embedded MLflow store for one test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A small local Ray for one test module, unless one is already up."""
    if ray.is_initialized():
        yield
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


SESSION_STATUS = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[SESSION_STATUS] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave with pytest's own status once the report is out, skipping the interpreter's teardown.

    Native threads of the libraries under test (Ray's core worker and gRPC, torch's pools)
    can crash while CPython finalises them, after every test has passed and been reported:
    the status would then say "segmentation fault" about a green run. The verdict is the
    session's, kept by `pytest_sessionfinish`; a crash during a test still fails it.
    """
    if SESSION_STATUS not in config.stash:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash[SESSION_STATUS])
