"""Throughput benchmarks: env steps/s, MAT latency, PPO training throughput, bank build rate,
live-mode scheduler overhead.

Figures are printed, not asserted: speed targets are measured here, never in
unit tests. The env benchmark drives the simulator with a trivial valid
policy (the first N occupied slots) so it measures the env, not a policy.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import PooledVectorEnv
from mara_fm.build_bank import BankConfig, build_bank
from mara_fm.fm_model import INFERENCE_BACKENDS
from mara_fm.predictors import FMPredictor, Predictor
from mara_fm.predictors.recall import has_memory
from mara_live.config import LiveConfig
from mara_live.runner import run_live
from mara_live.streams import generate_stream
from mara_rl.mat_module import MATConfig
from mara_rl.methods import Method
from mara_rl.policy import act, module_spec
from mara_rl.scheduler_config import SchedulerConfig
from mara_rl.train_scheduler import build_algorithm


def first_slots(obs: dict, n_nodes: int) -> np.ndarray:
    slots = np.flatnonzero(obs["slot_mask"])[:n_nodes]
    action = np.zeros(n_nodes, np.int64)
    action[: len(slots)] = slots + 1
    return action


def env_steps_per_second(cfg: EnvConfig, steps: int = 20_000, seed: int = 0, num_envs: int = 1) -> float:
    """Env steps per second in this process; `num_envs` > 1 steps a pooled vector env."""
    import torch

    torch.set_num_threads(1)  # as in an env runner
    if num_envs == 1:
        env = MultiNodeEnv(cfg)
        obs, _ = env.reset(seed=seed)
        done_steps = 0
        start = time.perf_counter()
        while done_steps < steps:
            obs, _, done, _, _ = env.step(first_slots(obs, cfg.n_nodes))
            done_steps += 1
            if done:
                obs, _ = env.reset(seed=seed + done_steps)
        return done_steps / (time.perf_counter() - start)
    venv = PooledVectorEnv(num_envs, cfg)
    obs, _ = venv.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(-(-steps // num_envs)):
        actions = np.stack([first_slots({"slot_mask": mask}, cfg.n_nodes) for mask in obs["slot_mask"]])
        obs, *_ = venv.step(actions)
    return num_envs * -(-steps // num_envs) / (time.perf_counter() - start)


def bank_build_rate(curves_per_id_family: int = 2, curves_per_ood_set: int = 4) -> dict[str, float]:
    """Build a small bank from scratch with all cores; curves per second."""
    cfg = BankConfig(curves_per_id_family=curves_per_id_family, curves_per_ood_set=curves_per_ood_set)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        build_bank(cfg, Path(tmp) / "bench.parquet", progress=False)
        seconds = time.perf_counter() - start
    n = 8 * curves_per_id_family + 2 * curves_per_ood_set
    return {"curves": n, "seconds": seconds, "curves_per_second": n / seconds}


def mat_decision_ms(cfg: EnvConfig, mat: MATConfig | None = None, decisions: int = 300, seed: int = 0,
                    repeats: int = 3) -> float:
    """ms per greedy joint action of a (fresh) MAT policy on real observations, 1 thread:
    the median over `decisions` steps, the lowest of `repeats` such medians (as `timeit`
    advises: other load on the machine only ever adds time)."""
    import torch

    torch.set_num_threads(1)
    module = module_spec(cfg, mat or MATConfig()).build().eval()
    env = MultiNodeEnv(cfg)
    medians = []
    for _ in range(repeats):
        obs, _ = env.reset(seed=seed)
        times = []
        for _ in range(decisions):
            start = time.perf_counter()
            action = act(module, obs)
            times.append(time.perf_counter() - start)
            obs, _, done, _, _ = env.step(action)
            if done:
                obs, _ = env.reset(seed=seed + len(times))
        medians.append(float(np.median(times)))
    return 1000 * min(medians)


def training_steps_per_second(sched: SchedulerConfig, env_cfg: EnvConfig, iterations: int = 3) -> float:
    """Env steps sampled and trained per second by RLlib's PPO with the configured env
    runners, over the iterations after the first (which pays for start-up)."""
    import ray

    started = not ray.is_initialized()
    try:
        algo = build_algorithm(sched, env_cfg)
        result = algo.train()
        before = result["num_env_steps_sampled_lifetime"]
        start = time.perf_counter()
        for _ in range(iterations - 1):
            result = algo.train()
        seconds = time.perf_counter() - start
        algo.stop()
        return (result["num_env_steps_sampled_lifetime"] - before) / seconds
    finally:
        if started:
            ray.shutdown()


def live_overhead(method: Method, env_cfg: EnvConfig, cfg: LiveConfig, ticks: int = 300) -> dict[str, float]:
    """Scheduler time per tick of a live run on Ray (allocator, predictor and bookkeeping; the
    nodes' training excluded), over a generated stream of `ticks` ticks."""
    env_cfg = replace(env_cfg, horizon=ticks)
    stream = generate_stream(env_cfg, cfg.stream_seed)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = run_live(method.name, method.make, method.env_config(env_cfg), stream, Path(tmp) / "run", cfg,
                          progress=False)
        seconds = time.perf_counter() - start
    per_tick = result.overhead_ms
    return {"live_overhead_ms_median": float(np.median(per_tick)), "live_overhead_ms_p95": float(np.percentile(per_tick, 95)),
            "live_ticks_per_s": ticks / seconds, "live_jobs": len(stream.jobs)}


def run_bench(cfg: EnvConfig, steps: int = 20_000, bank_rate: bool = True,
              fm_path: str | None = None, pooled_envs: int = 8, history_path: str | None = None,
              training: tuple[SchedulerConfig, EnvConfig] | None = None,
              mat: MATConfig | None = None,
              live: tuple[Method, EnvConfig, LiveConfig] | None = None) -> dict[str, float]:
    """Print and return every figure; `training` is a run's config and its training env,
    `mat` the network whose decision latency is measured (the profile's), `live` a method
    and the settings of a short live run."""
    results: dict[str, float] = {}
    predictors: dict[str, str | Predictor] = {"wls": "wls", "oracle": "oracle"}
    if fm_path:  # FM as exported, and on the other inference backend
        exported = FMPredictor.load(fm_path)
        predictors["fm"] = exported
        for backend in (b for b in INFERENCE_BACKENDS if b != exported.cfg.inference):
            predictors[f"fm_{backend}"] = FMPredictor.load(fm_path, inference=backend)
        if has_memory(fm_path):
            predictors["recall"] = f"recall:{fm_path}"
    if history_path:
        predictors["history"] = f"history:{history_path}"
    for name, predictor in predictors.items():
        for num_envs in (1, pooled_envs):
            rate = env_steps_per_second(replace(cfg, predictor=predictor), steps, num_envs=num_envs)
            key = f"env_steps_per_s_{name}" + (f"_pooled{num_envs}" if num_envs > 1 else "")
            results[key] = rate
            how = "one env" if num_envs == 1 else f"{num_envs} envs pooled"
            print(f"env steps/s, predictor={name:9s}: {rate:9.0f}  (one process, {how}, {steps} steps)")
    ms = mat_decision_ms(cfg, mat)
    results["mat_decision_ms"] = ms
    print(f"MAT decision latency: {ms:.2f} ms per joint action "
          f"(N={cfg.n_nodes}, K={cfg.n_slots}, greedy, 1 CPU thread, lowest of 3 medians of 300)")
    if training is not None:
        sched, env_cfg = training
        rate = training_steps_per_second(sched, env_cfg)
        results["training_steps_per_s"] = rate
        print(f"PPO training throughput: {rate:.0f} env steps/s sampled and trained "
              f"({sched.num_env_runners} env runners x {sched.num_envs_per_env_runner} envs, "
              f"predictor={sched.predictor}, batch {sched.train_batch_size})")
    if live is not None:
        method, env_cfg, live_cfg = live
        figures = live_overhead(method, env_cfg, live_cfg)
        results.update(figures)
        print(f"live scheduler overhead ({method.name}): {figures['live_overhead_ms_median']:.2f} ms per tick "
              f"(median; p95 {figures['live_overhead_ms_p95']:.2f}; allocator + predictor + bookkeeping, "
              f"N={env_cfg.n_nodes}, K={env_cfg.n_slots}); {figures['live_ticks_per_s']:.1f} ticks/s with "
              f"training, {figures['live_jobs']} jobs")
    if bank_rate:
        b = bank_build_rate()
        results["bank_curves_per_s"] = b["curves_per_second"]
        print(f"curve-bank build rate: {b['curves_per_second']:.2f} curves/s "
              f"({b['curves']} curves of 300 batches in {b['seconds']:.1f} s, all cores)")
    return results
