"""Training jobs: stepping one batch at a time is the bank's run, and a restored job continues exactly."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from mara_fm.families import FAMILIES
from mara_fm.jobs import TrainingJob


def _roundtrip(job: TrainingJob) -> dict:
    """The job's state as a checkpoint file would hold it."""
    buf = io.BytesIO()
    torch.save(job.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_paused_and_restored_job_continues_its_uninterrupted_curve(name: str) -> None:
    family = FAMILIES[name]
    torch.set_num_threads(1)
    uninterrupted = family.run(seed=7, cap=40)["losses"]
    first = family.job(7, planned=40)
    before = [first.step() for _ in range(13)]
    state = _roundtrip(first)
    before += [first.step() for _ in range(5)]  # the old copy trains on; the checkpoint must not follow it
    second = family.job(7, planned=40)
    second.load_state_dict(state)
    after = [second.step() for _ in range(27)]
    assert isinstance(second, TrainingJob)
    # A job that ignored the loaded state would start its curve over from batch 0 here.
    np.testing.assert_array_equal(np.maximum(before[:13] + after, 1e-12), uninterrupted)


def test_building_a_job_leaves_the_global_generator_alone() -> None:
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    FAMILIES["mlp_digits"].job(11, planned=10)
    assert torch.equal(torch.rand(3), expected)
