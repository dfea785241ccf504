"""A cluster as it is: nodes of different speeds, and restores that cost time (docs/design.md §10).

Both are options of `EnvConfig.cluster`, off by default (every node serves one
batch per step, switching is free), so the paper's setting is unchanged.

Speeds. Node i has speed v_i, a positive multiple of 1/2 (0.5: a slow node,
2: a fast one). Its clock decides how many batches it serves at step t:
floor((t+1)·v_i) − floor(t·v_i), so a node of speed 2 serves two batches every
step and one of speed 0.5 one batch at every odd step. The clock belongs to
the node, not to the task: which steps are productive does not depend on
what the node served before. Speeds are fixed by the profile, in node order.

Restores. A task that has been served before and is now served by another
node, or after at least one step without service, first spends r_k steps of
that node without progress (restoring its checkpoint); a restore that is
interrupted starts over. A node that keeps its task pays nothing, and the
first service of a task pays nothing (there is no checkpoint to restore).
r_k is drawn uniformly from the integers [restore_lo, restore_hi] by a
generator seeded with `restore_seed` and the episode's own content, so frozen
episodes carry the same costs for every method, and the episode files are
unchanged. A restore in progress counts as a busy node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from mara_common.config import ConfigError, check_config, setting


@dataclass
class ClusterConfig:
    node_speeds: tuple[float, ...] = setting((), help="batches per step of each node, in node order "
                                                      "(multiples of 0.5; empty: every node 1)")
    restore_lo: int = setting(0, ge=0, help="fewest steps a task's restore takes")
    restore_hi: int = setting(0, ge=0, help="most steps a task's restore takes (0: restores are free)")
    restore_seed: int = setting(0, ge=0, help="seed of the per-task restore costs (with the episode's content)")

    def __post_init__(self) -> None:
        check_config(self)
        bad = [v for v in self.node_speeds if v <= 0 or v * 2 != int(v * 2)]
        if bad:
            raise ConfigError(f"ClusterConfig.node_speeds must be positive multiples of 0.5, got {bad}")
        if self.restore_lo > self.restore_hi:
            raise ConfigError(f"ClusterConfig.restore_lo {self.restore_lo} > restore_hi {self.restore_hi}")

    @property
    def enabled(self) -> bool:
        """Whether any option departs from identical nodes and free switching."""
        return bool(self.node_speeds) or self.restore_hi > 0

    def speeds(self, n_nodes: int) -> np.ndarray:
        if not self.node_speeds:
            return np.ones(n_nodes)
        if len(self.node_speeds) != n_nodes:
            raise ConfigError(f"ClusterConfig.node_speeds has {len(self.node_speeds)} entries for "
                              f"{n_nodes} nodes")
        return np.asarray(self.node_speeds, np.float64)

    def restore_costs(self, curve_ids: list[str], arrival: np.ndarray) -> np.ndarray:
        """r_k per task of an episode, from the episode's content and `restore_seed`."""
        if self.restore_hi == 0:
            return np.zeros(len(curve_ids), np.int64)
        content = hashlib.sha256(("|".join(curve_ids) + str(arrival.tolist())).encode()).digest()
        rng = np.random.default_rng([self.restore_seed, int.from_bytes(content[:8], "little")])
        return rng.integers(self.restore_lo, self.restore_hi + 1, len(curve_ids)).astype(np.int64)


def node_batches(speeds: np.ndarray, t: int) -> np.ndarray:
    """Batches each node serves at step t (its clock: floor((t+1)v) − floor(t v))."""
    return (np.floor((t + 1) * speeds) - np.floor(t * speeds)).astype(np.int64)


def steps_alone(demand: np.ndarray, arrival: np.ndarray, speed: float) -> np.ndarray:
    """Steps a task arriving at `arrival` needs alone on a node of `speed` to serve
    `demand` batches: the least s with floor((a+s)v) − floor(a v) ≥ d."""
    start = np.floor(arrival * speed)
    return np.ceil((start + demand) / speed - arrival - 1e-9).astype(np.float64)
