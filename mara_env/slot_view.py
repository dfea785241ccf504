"""What a non-learned allocator may read about the env's active slots (`MultiNodeEnv.scheduler_view`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SlotView:
    """Per-slot state for allocators: arrival order, deadlines, observations, predictions."""

    t: int
    present: np.ndarray
    arrival: np.ndarray
    deadline: np.ndarray
    observed: np.ndarray
    predicted: np.ndarray
    n_nodes: int
    optimistic: np.ndarray | None = None  # with EnvConfig.optimistic_quantile only
    probe_points: int | None = None  # EnvConfig.probe_points
    # The cluster (`EnvConfig.cluster`): node speeds, the slot each node served last (-1: none),
    # each slot's restore cost and restore steps left (the last three None when it is off).
    speeds: np.ndarray | None = None
    node_slot: np.ndarray | None = None
    restore_cost: np.ndarray | None = None
    restore_left: np.ndarray | None = None
    # Each slot's task index in the episode, and the env's identity: for allocators that keep
    # state about tasks across steps (admission control).
    task: np.ndarray | None = None
    env_key: tuple[int, int] = (0, 0)
    # Each slot's threshold ε, and its observed cumulative-average losses (a peer fits them).
    eps: np.ndarray | None = None
    losses: Callable[[int], np.ndarray] | None = None

    @property
    def capacity(self) -> float:
        """Batches the nodes serve per step together (N when every node has speed 1)."""
        return float(self.speeds.sum()) if self.speeds is not None else float(self.n_nodes)
