"""The simulator over live jobs: the same env, whose curves are trained as it reads them.

`LiveEnv` is a `MultiNodeEnv` (every rule of docs/design.md §3–§4 unchanged) over a
`GrowingCurves`: when a step is about to reveal points of a task's curve
(`MultiNodeEnv.reveal`), it hands the node that serves the task the batches to
train (`Trainer`) and writes back the losses. The simulator's decisions then
rest on nothing but what real training produced, up to the current step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mara_common.config import ConfigError
from mara_env.env import EnvConfig, MultiNodeEnv, progress_terms
from mara_live.curves import GrowingCurves


@dataclass(frozen=True)
class Assignment:
    """Node `node` trains task `task` from batch `start` (its known points) to `stop`."""

    task: int
    node: int
    start: int
    stop: int


# Trains the assignments of one step, all at once; the losses of each, in order.
Trainer = Callable[[list[Assignment]], list[np.ndarray]]


class LiveEnv(MultiNodeEnv):
    def __init__(self, config: EnvConfig, curves: GrowingCurves, trainer: Trainer) -> None:
        if str(config.predictor).startswith("oracle"):
            raise ConfigError("a live run cannot use the oracle predictor: a job's future is not known")
        if config.cluster.enabled:
            raise ConfigError("live runs use the paper's nodes (cluster options off): node speeds and "
                              "restore costs are those of the real workers")
        if (config.decision_interval or 1) > 1:
            raise ConfigError("live runs decide every tick: a policy trained with decision_interval "
                              f"{config.decision_interval} (decisions at events) cannot run live")
        if config.critic_features:
            raise ConfigError("a live run cannot show the critic's features: they are the jobs' true future")
        super().__init__(config, curves)
        self.trainer = trainer

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        out = super().reset(seed=seed, options=options)
        if not np.array_equal(self.task_rows, np.arange(len(self.task_rows))):
            raise ValueError("a live episode lists the live curves in arrival order (Stream.episode())")
        # Views of the growing arrays, not copies: points written later are read here.
        self.task_avg, self.task_log_avg = self.curves.avg, self.curves.log_avg
        return out

    def reveal(self, tasks: np.ndarray, upto: np.ndarray) -> None:
        curves: GrowingCurves = self.curves
        start = curves.known[tasks]
        node_of = {k: i for i, k in enumerate(self.node_task.tolist()) if k >= 0}
        work = [Assignment(int(k), node_of[int(k)], int(a), int(b))
                for k, a, b in zip(tasks, start, upto, strict=True) if b > a]
        if not work:
            return
        for job, losses in zip(work, self.trainer(work), strict=True):
            if len(losses) != job.stop - job.start:
                raise RuntimeError(f"node {job.node} returned {len(losses)} losses for job {curves.ids[job.task]}, "
                                   f"asked for {job.stop - job.start}")
            curves.write(job.task, losses)
        first = np.array([job.task for job in work if job.start == 0], np.int64)
        if len(first):  # the progress terms of a task read its first loss (known only now)
            self.log_first[first] = self.task_log_avg[first, 0]
            self.q_scale[first], self.q_offset[first] = progress_terms(self.log_first[first], np.log(self.eps[first]))
