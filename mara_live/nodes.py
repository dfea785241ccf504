"""A compute node of a live run: a Ray actor that trains whichever job it is given.

A node trains one job at a time. Given another job, it first checkpoints the
one it holds and keeps it in memory among the few it paused last, so that
resuming it there costs nothing; any other job is restored from its last
checkpoint (or built fresh) and, if that checkpoint is behind the points the
scheduler already knows — the node that held it died — trained up to them
again. Those replayed losses come back with the new ones, so the driver can
check that the curve continues exactly. Checkpoints are files in a folder every
node can reach (on a multi-machine cluster: shared storage), written atomically.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mara_fm.jobs import TrainingJob
from mara_live.streams import JobSpec, job_builder


@dataclass
class HeldJob:
    job_id: str
    job: TrainingJob
    points: int  # batches trained
    saved_at: int  # points in its latest checkpoint


class NodeWorker:
    """One node (wrapped by `ray.remote` in `mara_live.runner`)."""

    def __init__(self, node: int, checkpoint_dir: str, threads: int = 1, keep_paused: int = 4) -> None:
        torch.set_num_threads(threads)
        self.node = node
        self.dir = Path(checkpoint_dir)
        self.held: HeldJob | None = None
        # Jobs this node paused, still in memory (also checkpointed): resuming one here costs nothing.
        self.paused: OrderedDict[str, HeldJob] = OrderedDict()
        self.keep_paused = keep_paused

    def pid(self) -> int:
        return os.getpid()

    def train(self, job_id: str, spec: JobSpec, planned: int, start: int, stop: int,
              checkpoint_every: int) -> dict[str, Any]:
        """Train `job_id` from batch `start` to `stop`: {"losses", "replayed" (batches retrained
        from a checkpoint behind `start`, with their losses), "loaded" (None: the job was in
        memory, else "fresh" or "checkpoint"), "load_s", "train_s"}."""
        loaded, load_s = None, 0.0
        if self.held is not None and self.held.job_id != job_id:
            self.release(self.held.job_id)
        if self.held is None:
            kept = self.paused.pop(job_id, None)
            if kept is not None and kept.points == start:  # else it trained elsewhere since
                self.held = kept
            else:
                began = time.perf_counter()
                self.held = self._restore(job_id, spec, planned, start)
                load_s = time.perf_counter() - began
                loaded = "checkpoint" if self.held.points else "fresh"
        held = self.held
        if held.points > start:
            raise RuntimeError(f"node {self.node}: job {job_id} is at batch {held.points}, asked to train from {start}")
        began = time.perf_counter()
        replayed = [held.job.step() for _ in range(start - held.points)]
        losses = [held.job.step() for _ in range(stop - start)]
        held.points = stop
        train_s = time.perf_counter() - began
        if held.points - held.saved_at >= checkpoint_every:
            self._save(held)
        return {"losses": losses, "replayed": replayed, "loaded": loaded, "load_s": load_s, "train_s": train_s}

    def release(self, job_id: str) -> float:
        """Checkpoint `job_id` and free the node (the job pauses or moves); seconds spent. The
        job stays in memory among the node's `keep_paused` most recent."""
        if self.held is None or self.held.job_id != job_id:
            return 0.0
        began = time.perf_counter()
        if self.held.saved_at < self.held.points:
            self._save(self.held)
        self.paused[job_id] = self.held
        self.held = None
        while len(self.paused) > self.keep_paused:
            self.paused.popitem(last=False)
        return time.perf_counter() - began

    def drop(self, job_id: str) -> None:
        """Forget a finished job (its checkpoint is of no further use)."""
        if self.held is not None and self.held.job_id == job_id:
            self.held = None
        self.paused.pop(job_id, None)
        self._path(job_id).unlink(missing_ok=True)

    def _path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.pt"

    def _save(self, held: HeldJob) -> None:
        path = self._path(held.job_id)
        tmp = path.with_suffix(f".tmp{self.node}")
        torch.save({"points": held.points, "state": held.job.state_dict()}, tmp)
        tmp.replace(path)
        held.saved_at = held.points

    def _restore(self, job_id: str, spec: JobSpec, planned: int, known: int) -> HeldJob:
        """From its checkpoint, or fresh. A checkpoint ahead of the `known` points (saved in a
        tick the scheduler never logged, before it stopped) cannot be trusted to match them."""
        job = job_builder(spec.kind)(spec.seed, planned)
        path = self._path(job_id)
        saved = torch.load(path, weights_only=False) if path.exists() else None
        if saved is None or saved["points"] > known:
            return HeldJob(job_id, job, 0, 0)
        job.load_state_dict(saved["state"])
        return HeldJob(job_id, job, int(saved["points"]), int(saved["points"]))
