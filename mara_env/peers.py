"""Schedulers from the systems literature, as peers of the paper's baselines (docs/design.md §10.3).

Each is written from its paper's description and adapted to this problem:
tasks use one node at a time, a task's demand is unknown until its curve is
seen, and success means reaching ε by the deadline. Each docstring says what
it keeps and what it adapts. All place their choices with `placed_action`, so
with the cluster options on a task keeps its node and new work goes to the
fastest free nodes; with them off that is the plain node order.
"""

from __future__ import annotations

import numpy as np

from mara_env.allocators import Allocator, can_meet_deadlines, placed_action
from mara_env.slot_view import SlotView
from mara_fm.predictors import WARMUP_POINTS


class LeastAttainedService(Allocator):
    """Tiresias-style discretised least-attained-service (Gu et al., NSDI 2019). No forecasts.

    Kept: priority by attained service, discretised into queues so that jobs are
    not preempted at every step; FIFO within a queue; no knowledge of job length.
    Adapted: a task's attained service is the batches it has been served (one
    node at a time, so service is time × speed), and two queues split at
    `threshold` batches, as in Tiresias's two-queue default.
    """

    name = "las"
    threshold = 20

    def act(self, view: SlotView) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        queue = (view.observed[slots] >= self.threshold).astype(np.int64)
        order = slots[np.lexsort((slots, view.arrival[slots], queue))]
        return placed_action(order.tolist(), view)


def fit_optimus(losses: np.ndarray) -> tuple[float, float, float]:
    """(β0, β1, β2) of l(k) = 1 / (β0·k + β1) + β2 fitted to losses at k = 1..n.

    For each β2 on a grid below the lowest loss, 1 / (l − β2) is linear in k
    (least squares, slope clipped at 0); the β2 whose line fits best in loss
    space wins.
    """
    k = np.arange(1, len(losses) + 1, dtype=np.float64)
    beta2 = np.linspace(0.0, 0.99, 12)[:, None] * losses.min()
    y = 1.0 / (losses[None, :] - beta2)  # (G, n)
    kc = k - k.mean()
    slope = np.maximum((y * kc).sum(1) / (kc @ kc), 0.0)
    intercept = y.mean(1) - slope * k.mean()
    fitted = 1.0 / np.maximum(slope[:, None] * k + intercept[:, None], 1e-12) + beta2
    best = int(np.argmin(((fitted - losses) ** 2).mean(1)))
    return float(slope[best]), float(intercept[best]), float(beta2[best, 0])


def optimus_remaining(losses: np.ndarray, eps: float) -> float:
    """Batches after the last observed one until the fitted curve reaches ε (inf: never)."""
    beta0, beta1, beta2 = fit_optimus(losses)
    if eps <= beta2 or beta0 <= 0.0:
        return np.inf
    return max(((1.0 / (eps - beta2)) - beta1) / beta0 - len(losses), 0.0)


class Optimus(Allocator):
    """Optimus-style allocation (Peng et al., EuroSys 2018): an online loss model, and nodes
    where they shorten completion most.

    Kept: each task's loss is fitted online to l(k) = 1/(β0·k + β1) + β2 (non-negative
    slope) and the fit gives the steps left to convergence (here: to ε); resources go
    greedily to the largest marginal reduction in completion time; deadlines play no
    part. Adapted: a task takes at most one node, so a node's marginal gain is the
    same whole remaining time for every task and the greedy order is shortest estimated
    remaining time first (the same order minimises mean completion time); the fit reads
    the cumulative-average loss the simulator reveals; a task with fewer than 4
    observations is served first (no fit yet), and a task whose fit never reaches ε last.
    """

    name = "optimus"

    def __init__(self) -> None:
        self.fits: dict[tuple[int, int, int], float] = {}

    def remaining(self, view: SlotView, s: int) -> float:
        key = (view.env_key, int(view.task[s]), int(view.observed[s]))
        if key not in self.fits:
            self.fits[key] = optimus_remaining(view.losses(s), float(view.eps[s]))
        return self.fits[key]

    def act(self, view: SlotView) -> np.ndarray:
        slots = np.flatnonzero(view.present)
        fresh = [s for s in slots if view.observed[s] < WARMUP_POINTS]
        rest = sorted((s for s in slots if view.observed[s] >= WARMUP_POINTS),
                      key=lambda s: (self.remaining(view, s), view.arrival[s], s))
        fresh.sort(key=lambda s: (view.arrival[s], s))
        return placed_action(fresh + rest, view)


class DeadlineAdmission(Allocator):
    """Deadline-aware admission in the style of ElasticFlow (Gu et al., ASPLOS 2023) and
    Chronus (Gao et al., SoCC 2021).

    Kept: a task is admitted only if every admitted deadline stays feasible with the
    estimated demand; admitted tasks are served earliest-deadline-first; a task is
    dropped as soon as it can no longer make its deadline. Adapted: demand is unknown
    at arrival, so the admission test runs once, when the task has its first forecast
    (after the predictor's warm-up; until then it is served first, EDF, as a profiling
    run); feasibility is the exact N-node test on the forecasts, in steps at the mean
    node speed; tasks not admitted, or dropped, get nodes left over, earliest deadline
    first (work-conserving), but never count against admission.
    """

    name = "admission"

    def __init__(self) -> None:
        self.admitted: dict[int, set[int]] = {}
        self.refused: dict[int, set[int]] = {}

    def act(self, view: SlotView) -> np.ndarray:
        admitted = self.admitted.setdefault(view.env_key, set())
        refused = self.refused.setdefault(view.env_key, set())
        slots = np.flatnonzero(view.present)
        edf = slots[np.lexsort((view.arrival[slots], view.deadline[slots]))].tolist()
        time_left = (view.deadline - view.t).astype(np.float64)
        steps = np.maximum(view.predicted, 1.0) / (view.capacity / view.n_nodes)
        task = view.task
        for s in edf:  # drop the admitted that can no longer make it
            if task[s] in admitted and steps[s] > time_left[s]:
                admitted.discard(task[s])
                refused.add(task[s])
        held = [s for s in edf if task[s] in admitted]
        for s in edf:  # admission, once per task, in deadline order
            if task[s] in admitted or task[s] in refused or view.observed[s] < WARMUP_POINTS:
                continue
            trial = held + [s]
            if can_meet_deadlines(steps[trial], time_left[trial], view.n_nodes):
                admitted.add(task[s])
                held = sorted(trial, key=edf.index)
            else:
                refused.add(task[s])
        profiling = [s for s in edf if view.observed[s] < WARMUP_POINTS and task[s] not in admitted]
        others = [s for s in edf if s not in held and s not in profiling]
        return placed_action(profiling + held + others, view)
