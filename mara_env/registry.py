"""Every non-learned allocator by name: the paper's baselines, the project's rules and the
systems literature's peers."""

from __future__ import annotations

from mara_env.allocators import EDF, FIFO, LARA, Allocator, LeastLaxity, OptimisticLARA
from mara_env.peers import DeadlineAdmission, LeastAttainedService, Optimus

ALLOCATORS: dict[str, type[Allocator]] = {
    cls.name: cls for cls in (FIFO, EDF, LARA, OptimisticLARA, LeastLaxity,
                              LeastAttainedService, Optimus, DeadlineAdmission)}
