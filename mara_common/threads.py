"""Thread settings of torch and of NumPy's BLAS, scoped to a block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cache

import torch
from threadpoolctl import ThreadpoolController


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


@cache
def _blas() -> ThreadpoolController:
    return ThreadpoolController().select(user_api="blas")  # found once: a search costs about 1 ms


def blas_threads(n: int) -> AbstractContextManager:
    """Run a block with NumPy's BLAS on `n` threads (about 10 µs to enter).

    NumPy's BLAS starts as many threads as cores for a product of a few hundred
    rows; beside another busy process that made the NumPy FM twice as slow as
    on one thread, while at these sizes a second thread gains nothing.
    """
    return _blas().limit(limits=n)
