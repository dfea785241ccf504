"""Non-learned allocators (docs/design.md §6): FIFO, EDF and LARA (and two variants of LARA).

Each maps a `SlotView` to a valid joint action (slot j is action j+1, each
slot picked by at most one node). The Oracle bound is not an allocator: it
is computed per episode by `mara_env.workload.oracle_successes`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from mara_env.slot_view import SlotView
from mara_fm.predictors import WARMUP_POINTS


def joint_action(slots: list[int], n_nodes: int) -> np.ndarray:
    """Nodes take `slots` in order; the rest idle."""
    action = np.zeros(n_nodes, np.int64)
    chosen = slots[:n_nodes]
    action[: len(chosen)] = np.asarray(chosen, np.int64) + 1
    return action


def placed_action(slots: list[int], view: SlotView, demand: np.ndarray | None = None) -> np.ndarray:
    """The first N of `slots` (in priority order) placed on nodes: with the cluster options on,
    a chosen task keeps the node that served it at the last step (no restore), and the others
    take the free nodes fastest first, in priority order; otherwise `joint_action`.

    With `demand` (batches per slot), a kept task moves to a faster node left idle when the
    move pays: restore r + d / v_fast < d / v_now steps.
    """
    if view.node_slot is None:
        return joint_action(slots, view.n_nodes)
    chosen = slots[:view.n_nodes]
    action = np.zeros(view.n_nodes, np.int64)
    holder = {s: i for i, s in enumerate(view.node_slot.tolist()) if s >= 0}
    free = sorted((i for i in range(view.n_nodes) if view.node_slot[i] not in chosen),
                  key=lambda i: (-view.speeds[i], i))
    for s in chosen:
        node = holder[s] if s in holder else free.pop(0)
        action[node] = s + 1
    if demand is not None:
        speeds = view.speeds
        for fast in (i for i in free if action[i] == 0):
            movable = [i for i in np.flatnonzero(action)
                       if speeds[i] < speeds[fast] and np.isfinite(demand[action[i] - 1])]
            gain = {i: demand[action[i] - 1] / speeds[i] - demand[action[i] - 1] / speeds[fast]
                    - view.restore_cost[action[i] - 1] for i in movable}
            best = max(gain, key=gain.get, default=None)
            if best is not None and gain[best] > 0:
                action[fast], action[best] = action[best], 0
    return action


class Allocator(ABC):
    name: str

    @abstractmethod
    def act(self, view: SlotView) -> np.ndarray:
        """The joint action for this step."""


class FIFO(Allocator):
    """Serve the N earliest-arrived active tasks."""

    name = "fifo"

    def act(self, view: SlotView) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        order = slots[np.lexsort((slots, view.arrival[slots]))]
        return joint_action(order.tolist(), view.n_nodes)


class EDF(Allocator):
    """Serve the N active tasks with the earliest deadlines."""

    name = "edf"

    def act(self, view: SlotView) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        order = slots[np.lexsort((view.arrival[slots], view.deadline[slots]))]
        return joint_action(order.tolist(), view.n_nodes)


class LARA(Allocator):
    """Predict demand, keep the largest set that can meet its deadlines, serve it EDF.

    1. Tasks still in warm-up (< 4 observations) are served first, EDF.
    2. Tasks whose predicted demand exceeds their remaining time are dropped.
    3. Moore–Hodgson on N parallel nodes: walk the rest in EDF order; when
       the cumulative demand up to a deadline D exceeds N·(D − t), remove the
       largest-demand task kept so far. The kept set is served EDF.
    4. Work-conserving: nodes left over go to the remaining tasks, smallest
       predicted shortfall (demand − time left) first.
    The demand estimates come from the env's predictor (WLS for LARA, FM for
    LARA-FM), so the same class serves both.
    """

    name = "lara"
    # Aware of the cluster (speeds, restores): off for the paper's LARA.
    aware = False

    def estimate(self, view: SlotView) -> np.ndarray:
        """The demand the plan reads."""
        return view.predicted

    def judged_after(self, view: SlotView) -> int:
        """Observations before a task's forecast counts; fewer: served first, EDF."""
        return WARMUP_POINTS

    def overloaded(self, kept: list[int], demand: np.ndarray, time_left: np.ndarray, view: SlotView) -> bool:
        """docs/design.md's test, on the task just added (the latest deadline so far)."""
        return demand[kept].sum() > self.speed(view) * view.n_nodes * time_left[kept[-1]]

    def speed(self, view: SlotView) -> float:
        """Batches per node-step the plan counts on: 1, or the mean node speed when aware."""
        return view.capacity / view.n_nodes if self.aware else 1.0

    def plan_demand(self, view: SlotView) -> np.ndarray:
        """Batches each task still needs; when aware, plus its pending restore in batches
        (a paused or moved task restores before it progresses)."""
        demand = np.maximum(self.estimate(view), 1.0)
        if not self.aware or view.node_slot is None:
            return demand
        running = np.zeros(len(demand), bool)
        running[view.node_slot[view.node_slot >= 0]] = True
        pending = np.where(running, view.restore_left, np.where(view.observed > 0, view.restore_cost, 0))
        return demand + pending * self.speed(view)

    def fastest(self, view: SlotView) -> float:
        """The most batches per step one task can get: 1, or the fastest node's speed when aware."""
        return float(view.speeds.max()) if self.aware and view.speeds is not None else 1.0

    def service_order(self, kept: list[int], demand: np.ndarray, time_left: np.ndarray) -> list[int]:
        return kept  # already in EDF order

    def act(self, view: SlotView) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        edf = slots[np.lexsort((view.arrival[slots], view.deadline[slots]))]
        first = self.judged_after(view)
        warm = [s for s in edf if view.observed[s] < first]
        rest = [s for s in edf if view.observed[s] >= first]
        time_left = (view.deadline - view.t).astype(np.float64)
        demand = self.plan_demand(view)
        kept: list[int] = []
        for s in (s for s in rest if demand[s] <= self.fastest(view) * time_left[s]):  # EDF order
            kept.append(s)
            if self.overloaded(kept, demand, time_left, view):
                kept.remove(max(kept, key=lambda k: demand[k]))
        leftover = sorted((s for s in rest if s not in kept), key=lambda s: (demand[s] - time_left[s], s))
        order = warm + self.service_order(kept, demand / self.speed(view), time_left) + leftover
        return placed_action(order, view, demand) if self.aware else joint_action(order, view.n_nodes)


class OptimisticLARA(LARA):
    """LARA on the predictor's optimistic estimate (`EnvConfig.optimistic_quantile`).

    With FM's sampled crossings, planning on a low order statistic (the profile's q)
    instead of the median keeps tasks that a fair share of the samples call
    feasible, and gives the leftover nodes to the tasks most likely to still
    make it; on the ID validation episodes that is worth +1.5 points over
    LARA-FM (docs/decisions.md). The estimate is `inf` for a task
    that even the optimistic sample never brings to its threshold within its
    generation cap (where LARA's median reads the rest of the cap, which looks
    feasible when the deadline is at the cap): such a task is dropped and gets
    leftover nodes last. With WLS it is LARA with that rule. With
    `EnvConfig.probe_points` = P, a task is judged only after P observations
    (before that it is served first, like a task in warm-up).

    It is aware of the cluster (docs/design.md §10.3): with the cluster options on it plans
    against the nodes' capacity with pending restores added, keeps a task only if the
    fastest node could finish it in time, and places work with `placed_action` (a task
    stays where it runs; it moves to a faster idle node only when that pays). On identical
    nodes with free switching all of this is the rule above.
    """

    name = "lara_optimistic"
    aware = True

    def estimate(self, view: SlotView) -> np.ndarray:
        if view.optimistic is None:
            raise ValueError(f"{self.name} needs an env with EnvConfig.optimistic_quantile set")
        return view.optimistic

    def judged_after(self, view: SlotView) -> int:
        return view.probe_points or WARMUP_POINTS


def can_meet_deadlines(demand: np.ndarray, time_left: np.ndarray, n_nodes: int) -> bool:
    """Whether tasks all present now, each needing `demand` steps on one node at a time
    before `time_left` runs out, fit on `n_nodes` nodes (preemption and moves free).

    For every deadline τ, the work that must be done before τ — all of a task due by
    then, and of a later one the part that does not fit between τ and its own
    deadline — must fit in n_nodes·τ. With a common start this is exact (the tests
    check it against the problem's transportation LP on random instances).
    """
    if (demand > time_left).any():
        return False
    for tau in np.unique(time_left):
        if np.maximum(demand - np.maximum(time_left - tau, 0.0), 0.0).sum() > n_nodes * tau:
            return False
    return True


class LeastLaxity(OptimisticLARA):
    """`lara_optimistic` with the exact feasibility test and least-laxity-first service.

    docs/design.md's test counts only the tasks due by each deadline and EDF service lets a
    long task with a later deadline wait until it can no longer finish; both are
    exact on one node and not on N. Here the kept set passes `can_meet_deadlines`,
    and it is served by least laxity (time left − demand), which keeps a long task
    running. It pays with exact demands and not with forecasts, whose errors make a
    task look urgent when it is merely overestimated (docs/decisions.md); the
    evaluation runs it on the true demand (`llf_oracle`): how close planning on
    exact information comes to the Oracle bound.
    """

    name = "llf"

    def overloaded(self, kept: list[int], demand: np.ndarray, time_left: np.ndarray, view: SlotView) -> bool:
        return not can_meet_deadlines(demand[kept] / self.speed(view), time_left[kept], view.n_nodes)

    def service_order(self, kept: list[int], demand: np.ndarray, time_left: np.ndarray) -> list[int]:
        return sorted(kept, key=lambda s: (time_left[s] - demand[s], time_left[s], s))

