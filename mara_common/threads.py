"""Torch intra-op thread settings, scoped to a block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with `n` torch intra-op threads, restoring the setting after.

    At this project's model sizes a second thread gains little on an idle
    machine, while on a busy one OpenMP workers waiting for a core slow every
    op down by one to two orders of magnitude; the thread count also changes
    float sums in the last bits (so results are pinned to one thread where
    they are compared).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
