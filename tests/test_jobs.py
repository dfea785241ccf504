"""Training jobs: stepping one batch at a time is the bank's run, and a restored job continues exactly."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from mara_fm.build_bank import EVERY_FAMILY
from mara_fm.families import FAMILIES
from mara_fm.jobs import TrainingJob, lr_schedule


def _roundtrip(job: TrainingJob) -> dict:
    """The job's state as a checkpoint file would hold it."""
    buf = io.BytesIO()
    torch.save(job.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("name", sorted(EVERY_FAMILY))
def test_a_paused_and_restored_job_continues_its_uninterrupted_curve(name: str) -> None:
    family = EVERY_FAMILY[name]
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


@pytest.mark.parametrize("kind,expected", [
    ("step", [1, 1, 0.2, 0.04, 0.04]),          # milestones at 0.5 and 0.75 of 8 batches: t = 4, 6
    ("cosine", [1, 0.5 * (1 + np.cos(np.pi * 2 / 8)), 0.5, 0.5 * (1 + np.cos(np.pi * 6 / 8)), 0.0]),
    ("warmup", [0.25, 0.75, 1, 1, 1]),          # 4 warm-up batches (warmup = 0.5)
])
def test_learning_rate_schedules_follow_their_shape(kind: str, expected: list[float]) -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = lr_schedule(optimizer, kind, planned=8, warmup=0.5)
    seen = []
    for t in range(9):
        if t in (0, 2, 4, 6, 8):
            seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    np.testing.assert_allclose(seen, expected, atol=1e-12)


def test_an_unknown_schedule_is_refused_by_name() -> None:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match="'linear'"):
        lr_schedule(optimizer, "linear", planned=8)
