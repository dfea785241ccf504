"""The compute nodes of a live run: Ray actors that train whichever job they are given
(`NodeWorker`), and the pool the scheduler drives them through (`RayNodes`).

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
import signal
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from mara_fm.jobs import TrainingJob
from mara_live.config import LiveConfig
from mara_live.curves import GrowingCurves
from mara_live.env import Assignment
from mara_live.streams import JobSpec, Stream, job_builder


@dataclass
class HeldJob:
    job_id: str
    job: TrainingJob
    points: int  # batches trained
    saved_at: int  # points in its latest checkpoint


class NodeWorker:
    """One node (run as a Ray actor by `RayNodes`)."""

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


class RayNodes:
    """The node actors of a run and which job each holds; a `Trainer` for `LiveEnv`.

    A job leaves its node (checkpointed) when it pauses or moves; a node actor that
    died is replaced, and its job resumes from its checkpoint: the batches since are
    trained again and must give the losses already recorded.
    """

    def __init__(self, n_nodes: int, stream: Stream, curves: GrowingCurves, checkpoints: Path,
                 cfg: LiveConfig) -> None:
        self.remote = ray.remote(num_cpus=cfg.cpus_per_node, num_gpus=cfg.gpus_per_node, max_restarts=0)(NodeWorker)
        self.stream, self.curves, self.cfg = stream, curves, cfg
        self.checkpoints = checkpoints
        checkpoints.mkdir(parents=True, exist_ok=True)
        self.actors = [self._spawn(i) for i in range(n_nodes)]
        self.holder: dict[int, int] = {}  # task -> the node holding it in memory
        # builds: jobs started fresh on a node; restores: jobs loaded from a checkpoint (a resume
        # on the node that paused it, from memory, counts neither); release_s: checkpoint writes.
        self.stats = {"faults": 0, "replayed_batches": 0, "builds": 0, "build_s": 0.0, "restores": 0,
                      "restore_s": 0.0, "release_s": 0.0, "train_s": 0.0, "moves": 0}

    def _spawn(self, node: int):
        return self.remote.remote(node, str(self.checkpoints), self.cfg.threads_per_node, self.cfg.paused_per_node)

    def _replace(self, node: int) -> None:
        self.stats["faults"] += 1
        self.actors[node] = self._spawn(node)
        self.holder = {k: i for k, i in self.holder.items() if i != node}

    def _get(self, node: int, ref: ray.ObjectRef, method: str, *args: Any) -> Any:
        """The result of call `ref` on node `node`; if the node died, the call again on a fresh one."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError:
            self._replace(node)
            return ray.get(getattr(self.actors[node], method).remote(*args))

    def __call__(self, work: list[Assignment]) -> list[np.ndarray]:
        serving = {a.task: a.node for a in work}
        leaving = [(k, i) for k, i in self.holder.items() if serving.get(k) != i]
        self.stats["moves"] += sum(k in serving for k, _ in leaving)
        # Checkpoint first (all nodes at once): a moving job is restored from it below.
        refs = [self.actors[i].release.remote(self.stream.ids[k]) for k, i in leaving]
        for (k, i), ref in zip(leaving, refs, strict=True):
            try:
                self.stats["release_s"] += ray.get(ref)
            except ray.exceptions.RayActorError:  # its job resumes from its last checkpoint
                self._replace(i)
            self.holder.pop(k, None)
        refs = [self.actors[a.node].train.remote(*self._args(a)) for a in work]
        outs = []
        for a, ref in zip(work, refs, strict=True):
            out = self._get(a.node, ref, "train", *self._args(a))
            self._check_replayed(a, out["replayed"])
            if out["loaded"] == "fresh":
                self.stats["builds"] += 1
                self.stats["build_s"] += out["load_s"]
            elif out["loaded"] == "checkpoint":
                self.stats["restores"] += 1
                self.stats["restore_s"] += out["load_s"]
            self.stats["train_s"] += out["train_s"]
            self.holder[a.task] = a.node
            outs.append(np.asarray(out["losses"], np.float64))
        return outs

    def _args(self, a: Assignment) -> tuple:
        return (self.stream.ids[a.task], self.stream.jobs[a.task], self.curves.cap, a.start, a.stop,
                self.cfg.checkpoint_every)

    def _check_replayed(self, a: Assignment, replayed: list[float]) -> None:
        if not replayed:
            return
        self.stats["replayed_batches"] += len(replayed)
        recorded = self.curves.losses[a.task, a.start - len(replayed):a.start]
        if not np.array_equal(np.maximum(replayed, 1e-12), recorded):
            raise RuntimeError(f"job {self.stream.ids[a.task]} restored on node {a.node} did not continue its "
                               f"curve: retrained batches {a.start - len(replayed)}..{a.start} differ from the "
                               "recorded losses (its state_dict misses part of its state)")

    def finish(self, tasks: list[int]) -> None:
        """Forget jobs that succeeded or expired (not waited for: a node runs its calls in order)."""
        for k in tasks:
            node = self.holder.pop(k, None)
            if node is not None:
                self.actors[node].drop.remote(self.stream.ids[k])

    def kill(self, node: int) -> None:
        """Kill node `node`'s process, as a crash would (the next call finds it dead)."""
        pid = ray.get(self.actors[node].pid.remote())
        os.kill(pid, signal.SIGKILL)
