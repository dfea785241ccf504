"""`mara live`: schedule real training jobs on Ray node actors, tick by tick.

Each tick the allocator (an exported MAT policy or any evaluation method) reads
the `LiveEnv` observation and picks a joint action; the env's step asks the
nodes to train one batch of each served job (`RayNodes`) and applies the
simulator's rules to the losses that come back. Every tick is appended to the
run's log (`ticks.jsonl`: the action and each job's new losses) before the next
begins, so a stopped run resumes: the log is replayed through the same env — the
decisions recomputed and checked against it — and live training continues from
the jobs' checkpoints (docs/design.md §11).

Ray runs locally by default (`ray.init()`) and on a cluster when `RAY_ADDRESS`
is set; the checkpoint folder must then be shared storage.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import ray
from tqdm import tqdm

from mara_common.config import ConfigError, check_config, setting
from mara_common.threads import torch_threads
from mara_env.env import ACTIVE, PENDING, SUCCEEDED, WAITING, EnvConfig, MultiNodeEnv, load_curves
from mara_env.vector import BatchDecide
from mara_fm.bank import save_bank
from mara_live.curves import GrowingCurves
from mara_live.env import Assignment, LiveEnv, Trainer
from mara_live.nodes import NodeWorker
from mara_live.streams import Stream

LOG, RESULT, BANK, CHECK = "ticks.jsonl", "result.json", "bank.parquet", "check.json"


@dataclass(frozen=True)
class LiveConfig:
    """Profile section `[live]`."""

    streams: int = setting(3, ge=1, help="generated streams a comparison runs")
    stream_seed: int = setting(1000, ge=0, help="seed of the first generated stream (then +1, +2, ...)")
    task_set: str = setting("id", help="the bank's task set generated streams draw from")
    split: str = setting("test", choices=("train", "val", "test"), help="the bank's split generated streams draw from")
    horizon: int = setting(1000, ge=1, help="ticks of a generated stream")
    arrival_prob: float = setting(0.04, gt=0.0, le=1.0, help="arrival probability per tick of a generated stream")
    methods: tuple[str, ...] = setting(("mara", "lara_fm_optimistic", "lara", "edf"),
                                       help="methods a comparison runs live")
    checkpoint_every: int = setting(25, ge=1, help="batches between periodic checkpoints of a job a node holds")
    cpus_per_node: float = setting(0.25, gt=0.0, help="CPUs Ray reserves for each node actor")
    gpus_per_node: float = setting(0.0, ge=0.0, help="GPUs Ray reserves for each node actor (0: CPU nodes)")
    threads_per_node: int = setting(1, ge=1, help="torch threads of each node actor")
    paused_per_node: int = setting(4, ge=0, help="paused jobs a node keeps in memory (resumed there: no restore)")
    kill_at: int = setting(-1, ge=-1, help="tick at which one node actor is killed on purpose (-1: never)")
    kill_node: int = setting(0, ge=0, help="the node killed at kill_at")
    show_every: int = setting(100, ge=0, help="ticks between per-node progress tables (0: none)")
    family_draws: int = setting(8, ge=1, help="replays of a stream on other runs of each job's family "
                                              "(the simulator's expectation for fresh runs)")

    def __post_init__(self) -> None:
        check_config(self)


class RayNodes:
    """The node actors of a run and which job each holds; a `Trainer` for `LiveEnv`.

    A job leaves its node (checkpointed) when it pauses or moves; a node actor that
    died is replaced, and its job resumes from its checkpoint: the batches since are
    trained again and must give the losses already recorded.
    """

    def __init__(self, n_nodes: int, stream: Stream, curves: GrowingCurves, checkpoints: Path,
                 cfg: LiveConfig) -> None:
        self.ray = ray
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

    def _call(self, node: int, method: str, *args: Any) -> Any:
        """A call on node `node`, on a fresh actor if the node died (once)."""
        try:
            return self.ray.get(getattr(self.actors[node], method).remote(*args))
        except self.ray.exceptions.RayActorError:
            self._replace(node)
            return self.ray.get(getattr(self.actors[node], method).remote(*args))

    def __call__(self, work: list[Assignment]) -> list[np.ndarray]:
        serving = {a.task: a.node for a in work}
        leaving = [(k, i) for k, i in self.holder.items() if serving.get(k) != i]
        self.stats["moves"] += sum(k in serving for k, _ in leaving)
        # Checkpoint first (all nodes at once): a moving job is restored from it below.
        refs = [self.actors[i].release.remote(self.stream.ids[k]) for k, i in leaving]
        for (k, i), ref in zip(leaving, refs, strict=True):
            try:
                self.stats["release_s"] += self.ray.get(ref)
            except self.ray.exceptions.RayActorError:  # its job resumes from its last checkpoint
                self._replace(i)
            self.holder.pop(k, None)
        refs = [self.actors[a.node].train.remote(*self._args(a)) for a in work]
        outs = []
        for a, ref in zip(work, refs, strict=True):
            try:
                out = self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                self._replace(a.node)
                out = self._call(a.node, "train", *self._args(a))
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
        pid = self.ray.get(self.actors[node].pid.remote())
        os.kill(pid, signal.SIGKILL)


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

    def __init__(self, log: TickLog, live: Trainer | None) -> None:
        self.log, self.live = log, live
        self.t = 0
        self.seconds = 0.0  # spent training (the nodes' calls included), summed over ticks
        self.losses: dict[int, np.ndarray] = {}

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


@dataclass
class LiveResult:
    success_rate: float
    succeeded: list[bool]
    served: np.ndarray  # (T, N) the job each node served per tick (-1: idle)
    stats: dict[str, Any]
    overhead_ms: np.ndarray  # scheduler time per tick: allocator, predictor, bookkeeping (not training)


def run_live(name: str, make_decide: Callable[[], BatchDecide], env_cfg: EnvConfig, stream: Stream, run_dir: Path,
             cfg: LiveConfig, progress: bool = True) -> LiveResult:
    """Run `stream` live in `run_dir` (resuming what is there) with the allocator `make_decide()`
    builds; `env_cfg` carries its predictor and view options (`Method.env_config`)."""
    env_cfg = replace(env_cfg, horizon=stream.horizon)
    run_dir.mkdir(parents=True, exist_ok=True)
    identity = {"method": name, "stream": [asdict(j) for j in stream.jobs],
                "horizon": stream.horizon, "predictor": str(env_cfg.predictor)}
    manifest = run_dir / "run.json"
    if manifest.exists() and json.loads(manifest.read_text()) != identity:
        raise ConfigError(f"{run_dir} holds another live run (method or stream differ); choose another --out")
    manifest.write_text(json.dumps(identity))
    if (run_dir / RESULT).exists():
        (run_dir / RESULT).unlink()  # rewritten at the end

    curves = GrowingCurves.for_stream(stream, cap=load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split).cap)
    log = TickLog(run_dir / LOG)
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    nodes = RayNodes(env_cfg.n_nodes, stream, curves, run_dir / "checkpoints", cfg)
    if log.past:
        nodes.stats.update(log.past[-1]["stats"])
    recorder = Recorder(log, nodes)
    decide = make_decide()
    placement = Placement()
    served, overhead = [], []
    with torch_threads(1):
        env = LiveEnv(env_cfg, curves, recorder)
        obs, _ = env.reset(options={"episode": stream.episode()})
        view = _progress(stream.horizon, cfg.show_every, progress)
        for t in range(stream.horizon):
            began = time.perf_counter()
            trained_before = recorder.seconds
            action = placement.place(np.asarray(decide({k: v[None] for k, v in obs.items()}, [env])[0]), env)
            if t < len(log.past) and action.tolist() != log.past[t]["action"]:
                raise RuntimeError(f"tick {t}: the allocator now picks {action.tolist()}, the log says "
                                   f"{log.past[t]['action']}; the run cannot resume (start a new run folder)")
            if t == cfg.kill_at and t >= len(log.past):
                nodes.kill(cfg.kill_node)
            active_before = set(np.flatnonzero(np.isin(env.status, (ACTIVE, WAITING))).tolist())
            obs, _, done, _, _ = env.step(action)
            if t >= len(log.past):
                log.write(t, action, recorder.losses, nodes.stats)
            recorder.t += 1
            served.append(env.node_task.copy())
            left = [k for k in active_before if env.status[k] not in (ACTIVE, WAITING, PENDING)]
            nodes.finish(left)
            overhead.append(time.perf_counter() - began - (recorder.seconds - trained_before))
            view(env, stream)
            if done:
                break
    summary = env.episode_summary()
    result = LiveResult(summary["success_rate"], (env.status == SUCCEEDED).tolist(), np.array(served),
                        {**nodes.stats, **summary, "expirations": env.stats["expirations"],
                         "rejections": env.stats["rejections"], "resumed_ticks": len(log.past),
                         "known_points": curves.known.tolist(), "batches": int(curves.known.sum())},
                        1000 * np.array(overhead))
    save_bank(curves.to_bank([j.seed for j in stream.jobs]), run_dir / BANK)
    (run_dir / RESULT).write_text(json.dumps({"method": name, "success_rate": result.success_rate,
                                              "succeeded": result.succeeded,
                                              "overhead_ms": overhead_figures(result.overhead_ms),
                                              "stats": result.stats}, indent=1, default=float))
    return result


def overhead_figures(per_tick_ms: np.ndarray) -> dict[str, float]:
    return {"mean": float(per_tick_ms.mean()), "median": float(np.median(per_tick_ms)),
            "p95": float(np.percentile(per_tick_ms, 95)), "max": float(per_tick_ms.max())}


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


def node_table(env: LiveEnv, stream: Stream) -> str:
    """Per node: the job it served at the last tick, its latest loss against its target, batches
    trained and ticks to its deadline."""
    lines = [f"tick {env.t}: {env.stats['successes']} succeeded, {env.stats['expirations']} expired",
             "node  job        kind             loss / target      batches  ticks left"]
    for i, k in enumerate(env.node_task.tolist()):
        if k < 0:
            lines.append(f"{i:>4}  idle")
            continue
        n = int(env.n_obs[k])
        loss = env.task_avg[k, n - 1] if n else float("nan")
        lines.append(f"{i:>4}  {stream.ids[k]:<9}  {stream.jobs[k].kind:<15}  {loss:8.4f} / {env.eps[k]:<8.4f}"
                     f"  {n:>7}  {int(env.deadline[k]) - env.t:>10}")
    return "\n".join(lines)


def _progress(horizon: int, show_every: int, enabled: bool):
    """A progress bar over ticks and, every `show_every` ticks, the per-node table."""
    bar = tqdm(total=horizon, desc="live ticks", unit="tick", disable=not enabled, mininterval=2.0)

    def update(env: LiveEnv, stream: Stream) -> None:
        bar.update(1)
        bar.set_postfix(succeeded=env.stats["successes"], expired=env.stats["expirations"], refresh=False)
        if enabled and show_every and env.t % show_every == 0:
            tqdm.write(node_table(env, stream))
        if env.t >= horizon:
            bar.close()
    return update
