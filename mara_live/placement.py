"""Which node serves each job the allocator chose."""

from __future__ import annotations

import numpy as np

from mara_env.env import MultiNodeEnv


class Placement:
    """Which node serves each job the allocator chose: a job keeps the node that served it last
    — at the last tick, or else earlier if that node is free — and the rest take the free nodes
    in order. On identical nodes with free switching the simulator's outcome does not depend
    on which node serves which task, so this changes nothing but the checkpoints and restores
    a live run pays (a node keeps the jobs it paused in memory, `NodeWorker`)."""

    def __init__(self) -> None:
        self.last: dict[int, int] = {}  # task -> the node that served it most recently

    def place(self, action: np.ndarray, env: MultiNodeEnv) -> np.ndarray:
        pick = {int(env.slot_task[a - 1]): int(a) for a in action if a > 0}  # task -> its action value
        running = {int(k): i for i, k in enumerate(env.node_task) if k >= 0}
        placed = np.zeros_like(action)
        free, todo = set(range(len(action))), list(pick)
        for wanted in (running, self.last):  # the node serving it now first, then its earlier one
            for k in list(todo):
                if wanted.get(k) in free:
                    placed[wanted[k]] = pick[k]
                    free.discard(wanted[k])
                    todo.remove(k)
        for k, node in zip(todo, sorted(free), strict=False):
            placed[node] = pick[k]
        self.last.update({int(env.slot_task[a - 1]): i for i, a in enumerate(placed) if a > 0})
        return placed
