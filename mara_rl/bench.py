"""Throughput benchmarks: env steps per second and curve-bank build rate.

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
from mara_fm.build_bank import BankConfig, build_bank


def first_slots(obs: dict, n_nodes: int) -> np.ndarray:
    slots = np.flatnonzero(obs["slot_mask"])[:n_nodes]
    action = np.zeros(n_nodes, np.int64)
    action[: len(slots)] = slots + 1
    return action


def env_steps_per_second(cfg: EnvConfig, steps: int = 20_000, seed: int = 0) -> float:
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


def bank_build_rate(curves_per_id_family: int = 2, curves_per_ood_set: int = 4) -> dict[str, float]:
    """Build a small bank from scratch with all cores; curves per second."""
    cfg = BankConfig(curves_per_id_family=curves_per_id_family, curves_per_ood_set=curves_per_ood_set)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        build_bank(cfg, Path(tmp) / "bench.parquet", progress=False)
        seconds = time.perf_counter() - start
    n = 8 * curves_per_id_family + 2 * curves_per_ood_set
    return {"curves": n, "seconds": seconds, "curves_per_second": n / seconds}


def mat_decision_ms(cfg: EnvConfig, decisions: int = 300, seed: int = 0) -> float:
    """Median ms per greedy joint action of a (fresh) MAT policy on real observations, 1 thread."""
    import torch

    from mara_rl.mat_module import MATConfig
    from mara_rl.train_scheduler import act, module_spec

    torch.set_num_threads(1)
    module = module_spec(cfg, MATConfig()).build().eval()
    env = MultiNodeEnv(cfg)
    obs, _ = env.reset(seed=seed)
    times = []
    for _ in range(decisions):
        start = time.perf_counter()
        action = act(module, obs)
        times.append(time.perf_counter() - start)
        obs, _, done, _, _ = env.step(action)
        if done:
            obs, _ = env.reset(seed=seed + len(times))
    return 1000 * float(np.median(times))


def run_bench(cfg: EnvConfig, steps: int = 20_000, bank_rate: bool = True,
              fm_path: str | None = None) -> dict[str, float]:
    results: dict[str, float] = {}
    predictors = ["wls", "oracle"] + ([f"fm:{fm_path}"] if fm_path else [])
    for predictor in predictors:
        rate = env_steps_per_second(replace(cfg, predictor=predictor), steps)
        results[f"env_steps_per_s_{predictor.split(':')[0]}"] = rate
        print(f"env steps/s, predictor={predictor.split(':')[0]:7s}: {rate:9.0f}  "
              f"(single process, {steps} steps)")
    ms = mat_decision_ms(cfg)
    results["mat_decision_ms"] = ms
    print(f"MAT decision latency: {ms:.2f} ms per joint action "
          f"(N={cfg.n_nodes}, K={cfg.n_slots}, greedy, 1 CPU thread, median of 300)")
    if bank_rate:
        b = bank_build_rate()
        results["bank_curves_per_s"] = b["curves_per_second"]
        print(f"curve-bank build rate: {b['curves_per_second']:.2f} curves/s "
              f"({b['curves']} curves of 300 batches in {b['seconds']:.1f} s, all cores)")
    return results
