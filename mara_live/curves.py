"""A curve set whose curves grow as live jobs train, and the bank it leaves behind.

The simulator reads a task's curve only at the points it has revealed; a live
run fills exactly those points, by training. `GrowingCurves` keeps the dense
arrays of a `CurveSet` (unknown points are NaN) and updates a curve's cumulative
averages with the same arithmetic a bank's curve set uses, so that the simulator
replaying the saved live bank sees the very numbers the live run saw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from mara_fm.bank import CurveSet
from mara_fm.families import FAMILIES
from mara_live.streams import Stream, hyperparameters

LIVE_TASK_SET = "live"


@dataclass(frozen=True)
class GrowingCurves(CurveSet):
    known: np.ndarray  # (n,) points known of each curve

    @classmethod
    def for_stream(cls, stream: Stream, cap: int) -> GrowingCurves:
        """One empty curve per job of `stream`, rows in arrival order (ids `stream.ids`)."""
        hyper = [hyperparameters(job) for job in stream.jobs]
        n = len(stream.jobs)
        return cls(ids=np.array(stream.ids, dtype=str), families=np.array([j.kind for j in stream.jobs], dtype=str),
                   batch_size=np.array([b for b, _ in hyper], np.int64), lr=np.array([lr for _, lr in hyper], np.float64),
                   losses=np.full((n, cap), np.nan), known=np.zeros(n, np.int64))

    @property
    def revision(self) -> int:
        return int(self.known.sum())

    def write(self, row: int, losses: np.ndarray) -> None:
        """Append a job's next batch losses; its averages follow (as `CurveSet.avg` computes them)."""
        losses = np.asarray(losses, np.float64)
        if not np.all(np.isfinite(losses)):
            raise ValueError(f"job {self.ids[row]}: training produced a non-finite loss {losses.tolist()}")
        start = int(self.known[row])
        stop = start + len(losses)
        if stop > self.cap:
            raise ValueError(f"job {self.ids[row]}: {stop} batches exceed the cap {self.cap}")
        # As a bank stores them: a loss of exactly 0 is float32 underflow, floored.
        self.losses[row, start:stop] = np.maximum(losses, 1e-12)
        avg = np.cumsum(self.losses[row, :stop]) / np.arange(1, stop + 1)
        self.avg[row, :stop] = avg
        self.log_avg[row, :stop] = np.log(avg)
        self.known[row] = stop

    def to_bank(self, seeds: list[int]) -> pd.DataFrame:
        """The live curves as bank rows (task set "live"). Points a job never reached repeat its
        last loss (1.0 for a job never served); `known` says how many are real, and the
        simulator replaying the live run never reads beyond them."""
        rows = []
        for i, cid in enumerate(self.ids.tolist()):
            k = int(self.known[i])
            fill = self.losses[i, k - 1] if k else 1.0
            losses = np.concatenate([self.losses[i, :k], np.full(self.cap - k, fill)])
            family = FAMILIES.get(self.families[i])
            rows.append({"curve_id": cid, "family": str(self.families[i]), "task_set": LIVE_TASK_SET,
                         "split": "test", "model": family.model if family else "user",
                         "dataset": family.dataset if family else "user", "seed": int(seeds[i]),
                         "batch_size": int(self.batch_size[i]), "lr": float(self.lr[i]), "losses": losses})
        return pd.DataFrame(rows)
