"""`mara live`: schedule real training jobs on Ray node actors, tick by tick.

Each tick the allocator (an exported MAT policy or any evaluation method) reads
the `LiveEnv` observation and picks a joint action, placed on nodes by
`Placement`; the env's step asks the nodes to train one batch of each served job
(`RayNodes`) and applies the simulator's rules to the losses that come back.
Every tick is logged before the next begins (`mara_live.log`), so a stopped run
resumes: the log is replayed through the same env — the decisions recomputed and
checked against it — and live training continues from the jobs' checkpoints
(docs/design.md §11).

Ray runs locally by default (`ray.init()`) and on a cluster when `RAY_ADDRESS`
is set; the checkpoint folder must then be shared storage.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import ray
from tqdm import tqdm

from mara_common.config import ConfigError
from mara_common.threads import torch_threads
from mara_env.env import ACTIVE, EXPIRED, SUCCEEDED, WAITING, EnvConfig, load_curves
from mara_env.vector import BatchDecide
from mara_fm.bank import save_bank
from mara_live.config import LiveConfig
from mara_live.curves import GrowingCurves
from mara_live.env import LiveEnv
from mara_live.log import LOG, Recorder, TickLog
from mara_live.nodes import RayNodes
from mara_live.placement import Placement
from mara_live.streams import Stream

RESULT, BANK, CHECK = "result.json", "bank.parquet", "check.json"


@dataclass
class LiveResult:
    success_rate: float
    succeeded: list[bool]
    served: np.ndarray  # (T, N) the job each node served per tick (-1: idle)
    stats: dict[str, Any]
    overhead_ms: np.ndarray  # scheduler time per tick: allocator, predictor, bookkeeping (not training)
    curves: GrowingCurves  # every job's losses and cumulative averages, as far as it was trained


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
    address = cluster_address()  # checked even when this process already runs a Ray
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
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
            recorder.begin(t)
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
            served.append(env.node_task.copy())
            nodes.finish([k for k in active_before if env.status[k] in (SUCCEEDED, EXPIRED)])
            overhead.append(time.perf_counter() - began - (recorder.seconds - trained_before))
            view(env, stream)
            if done:
                break
    summary = env.episode_summary()
    result = LiveResult(summary["success_rate"], (env.status == SUCCEEDED).tolist(), np.array(served),
                        {**nodes.stats, **summary, "expirations": env.stats["expirations"],
                         "rejections": env.stats["rejections"], "resumed_ticks": len(log.past),
                         "known_points": curves.known.tolist(), "batches": int(curves.known.sum())},
                        1000 * np.array(overhead), curves)
    save_bank(curves.to_bank([j.seed for j in stream.jobs]), run_dir / BANK)
    (run_dir / RESULT).write_text(json.dumps({"method": name, "success_rate": result.success_rate,
                                              "succeeded": result.succeeded,
                                              "overhead_ms": overhead_figures(result.overhead_ms),
                                              "stats": result.stats}, indent=1, default=float))
    return result


def cluster_address() -> str | None:
    """`RAY_ADDRESS` as `ray.init` takes it (None: a local Ray). A dashboard's http address
    is what job submission takes, not a driver: refused with the two ways that work."""
    address = os.environ.get("RAY_ADDRESS")
    if address and address.startswith(("http://", "https://")):
        raise ConfigError(f"RAY_ADDRESS={address} is a dashboard address: run the live scheduler on the cluster "
                          "with `mara submit-live` (which takes it), or point RAY_ADDRESS at the head's "
                          "GCS (HOST:6379) or `auto` on a cluster machine")
    return address


def overhead_figures(per_tick_ms: np.ndarray) -> dict[str, float]:
    return {"mean": float(per_tick_ms.mean()), "median": float(np.median(per_tick_ms)),
            "p95": float(np.percentile(per_tick_ms, 95)), "max": float(per_tick_ms.max())}


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
