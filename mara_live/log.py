"""The tick log of a live run, and the trainer that replays it before training live.

Every tick is appended to `ticks.jsonl` (its action, each job's new losses and
the nodes' running figures) before the next tick begins. A run started again
on the same folder replays the log through the same env — its losses instead
of training — and then trains on (`Recorder`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from mara_live.env import Assignment, Trainer

LOG = "ticks.jsonl"


class TickLog:
    """The run's log: one JSON line per tick, written before the next tick starts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.past = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        self.file = path.open("a")

    def write(self, t: int, action: np.ndarray, losses: dict[int, np.ndarray], stats: dict[str, float]) -> None:
        """One tick: its action, each job's new losses, and the nodes' running figures (a resumed
        run carries them on)."""
        self.file.write(json.dumps({"t": t, "action": action.tolist(),
                                    "losses": {str(k): v.tolist() for k, v in losses.items()},
                                    "stats": stats}) + "\n")
        self.file.flush()


class Recorder:
    """The trainer the env sees: it replays the log's losses for ticks already run, then trains live."""

    def __init__(self, log: TickLog, live: Trainer) -> None:
        self.log, self.live = log, live
        self.t = 0
        self.seconds = 0.0  # spent training (the nodes' calls included), summed over ticks
        self.losses: dict[int, np.ndarray] = {}  # the current tick's (none: nothing was trained)

    def begin(self, t: int) -> None:
        """Start tick `t`: a tick that trains nothing (idle nodes, jobs at their cap) logs no losses."""
        self.t, self.losses = t, {}

    def __call__(self, work: list[Assignment]) -> list[np.ndarray]:
        began = time.perf_counter()
        try:
            return self._train(work)
        finally:
            self.seconds += time.perf_counter() - began

    def _train(self, work: list[Assignment]) -> list[np.ndarray]:
        if self.t < len(self.log.past):
            past = self.log.past[self.t]["losses"]
            if sorted(past) != sorted(str(a.task) for a in work):
                raise RuntimeError(f"tick {self.t}: the resumed run serves other jobs than its log; "
                                   "it cannot resume (start a new run folder)")
            outs = [np.asarray(past[str(a.task)], np.float64) for a in work]
        else:
            outs = self.live(work)
        self.losses = {a.task: out for a, out in zip(work, outs, strict=True)}
        return outs
