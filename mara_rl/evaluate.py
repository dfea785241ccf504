"""Evaluate allocators on frozen, shared episodes (docs/design.md §8).

Episodes are generated once per (bank, task set, split, load, root), saved
under `data/episodes/`, and replayed by every method, so differences between
methods are paired. A method is a decision rule plus the predictor inside
the env (LARA reads WLS predictions, LARA-FM reads FM predictions).
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import os
import pickle
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mara_common.config import ConfigError, check_config, setting
from mara_common.paths import EPISODE_DIR
from mara_common.threads import torch_threads
from mara_env.cluster import ClusterConfig
from mara_env.env import EnvConfig, load_curves
from mara_env.vector import replay_in_lockstep
from mara_env.workload import (
    Episode,
    WorkloadConfig,
    load_episodes,
    oracle_successes,
    sample_episode,
    save_episodes,
    slack,
    stress_episode,
)
from mara_fm.bank import CurveSet, bank_digest
from mara_rl.methods import VARIANTS, Method
from mara_rl.provenance import cell_key, evaluation_inputs, input_tags
from mara_rl.records import (
    CELL_JOURNAL,
    Record,
    journal_records,
    log_records,
    open_journal,
    stored_records,
    write_results,
)

DIAGNOSTICS = ("utilisation", "full_queue_fraction", "waiting_population", "readiness_steps")
# Slack of a task = its window minus the batches it truly needs; feasible tasks have slack ≥ 0.
# Completion per slack band shows where methods differ: every method finishes the roomy
# tasks, and the bound (the Oracle completes every feasible task) caps what is left.
SLACK_EDGES = (0, 30, 60, 120)  # bands [0, 30), [30, 60), [60, 120), [120, ∞)


def slack_bands() -> list[tuple[str, int, float]]:
    """(diagnostic key, low, high) of each slack band of `SLACK_EDGES`."""
    highs = [*SLACK_EDGES[1:], math.inf]
    return [(f"completed_slack_{lo}_{'up' if hi == math.inf else hi}", lo, hi)
            for lo, hi in zip(SLACK_EDGES, highs, strict=True)]


COMPLETION = tuple(key for key, _, _ in slack_bands())


@dataclass(frozen=True)
class EvalConfig:
    """Profile section `[evaluation]`."""

    roots: int = setting(5, ge=1, help="evaluation roots (independent sets of frozen episodes)")
    episodes_per_root: int = setting(8, ge=1, help="frozen episodes per root")
    split: str = setting("test", choices=("test", "val"), help="curves the episodes come from")
    # Training seeds of each learned scheduler that `mara reproduce` trains and evaluates.
    scheduler_seeds: tuple[int, ...] = setting((0,), help="training seeds of each learned variant")
    # The learned variants (`mara_rl.methods.VARIANTS`) that `mara reproduce` trains and evaluates.
    variants: tuple[str, ...] = setting(tuple(v.name for v in VARIANTS if v.standard),
                                        help="learned variants to train")
    # Processes that evaluate (method, task set, load) cells side by side. Each cell runs whole
    # in one process on one torch thread, so the figures do not depend on this.
    workers: int = setting(0, ge=0, help="evaluation processes (0: one per CPU core)")

    def __post_init__(self) -> None:
        check_config(self)
        if not self.scheduler_seeds or min(self.scheduler_seeds) < 0 or \
                len(set(self.scheduler_seeds)) != len(self.scheduler_seeds):
            raise ValueError(f"scheduler_seeds must list distinct seeds >= 0, got {list(self.scheduler_seeds)}")
        unknown = sorted(set(self.variants) - {v.name for v in VARIANTS})
        if unknown:
            raise ConfigError(f"EvalConfig.variants: {unknown} unknown; known: {[v.name for v in VARIANTS]}")


def episode_root_seed(task_set: str, split: str, load: float, root: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([root, round(load * 10_000), *map(ord, f"{task_set}/{split}")])


def frozen_episodes(bank: Path, task_set: str, split: str, load: float, root: int, count: int,
                    horizon: int, workload: WorkloadConfig, scenario: str = "default") -> list[Episode]:
    """Load the frozen episodes of one root, generating and saving them the first time."""
    tag = "stress" if scenario == "stress" else f"p{load:.3f}"
    # The bank's content, the workload and the horizon are the key: a rebuilt bank or a changed
    # workload never reuses stale episodes.
    key = hashlib.sha1(json.dumps([asdict(workload), horizon]).encode()).hexdigest()[:8]
    path = EPISODE_DIR / f"{bank.stem}-{bank_digest(bank)}-{key}" / f"{task_set}-{split}-{tag}-root{root}.json"
    if path.exists():
        episodes = load_episodes(path)
        if len(episodes) >= count:
            return episodes[:count]
    curves = load_curves(bank, task_set, split)
    if scenario == "stress":
        episodes = [stress_episode(curves, horizon, seed=root)]
    else:
        rng = np.random.default_rng(episode_root_seed(task_set, split, load, root))
        episodes = [
            sample_episode(curves, horizon, load, workload, rng, None,
                           {"task_set": task_set, "split": split, "load": load, "root": root, "index": i})
            for i in range(count)
        ]
    save_episodes(episodes, path)
    return episodes


def pooled_episodes(cfg: EnvConfig, roots: int, per_root: int) -> list[Episode]:
    """Roots 0 … roots − 1's frozen episodes for `cfg`'s task set, split and load, in one
    list: for probes that replay them all together."""
    return [e for root in range(roots)
            for e in frozen_episodes(cfg.bank_path, cfg.task_set, cfg.split, cfg.arrival_prob, root,
                                     per_root, cfg.horizon, cfg.workload)]


def evaluate_method(method: Method, env_cfg: EnvConfig, episodes: list[list[Episode]]) -> dict:
    """Success rates (per episode, grouped by root) and mean diagnostics."""
    per_root: list[list[float]] = []
    diag: dict[str, list[float]] = {k: [] for k in DIAGNOSTICS}
    tasks: list[int] = []
    if method.make is None:
        curves = load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split)
        for root_eps in episodes:
            per_root.append([oracle_successes(e, curves, env_cfg.fastest) / max(len(e), 1) for e in root_eps])
            tasks += [len(e) for e in root_eps]
        return {"per_root": per_root, "diagnostics": {}, "tasks": tasks}
    if method.cluster is not None and ClusterConfig(**method.cluster) != env_cfg.cluster:
        raise ConfigError(f"{method.name}: the policy was trained with cluster options {method.cluster}, "
                          f"the evaluation runs {asdict(env_cfg.cluster)}; evaluate it in its own profile")
    cfg = method.env_config(env_cfg, strict=True)
    flat = [ep for root_eps in episodes for ep in root_eps]
    outs = replay_in_lockstep(cfg, flat, method.make())
    completion = completion_by_slack(flat, [out["succeeded"] for out in outs],
                                     load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split),
                                     env_cfg.fastest)
    for root_eps in episodes:
        root_outs, outs = outs[:len(root_eps)], outs[len(root_eps):]
        per_root.append([out["success_rate"] for out in root_outs])
        tasks += [out["episode_tasks"] for out in root_outs]
        for k in DIAGNOSTICS:
            diag[k] += [out[k] for out in root_outs]
    # NaN where a diagnostic was never measured (e.g. readiness in episodes without a ready task)
    means = {k: float(np.nanmean(v)) if not np.isnan(v).all() else math.nan
             for k, v in ((k, np.asarray(v, float)) for k, v in diag.items())}
    return {"per_root": per_root, "tasks": tasks, "diagnostics": {**means, **completion}}


def completion_by_slack(episodes: list[Episode], succeeded: list[np.ndarray], curves: CurveSet,
                        speed: float = 1.0) -> dict[str, float]:
    """Share of the feasible tasks in each slack band that succeeded (NaN for an empty band);
    slack in steps alone on a node of `speed`, the fastest (the bound's)."""
    spare = np.concatenate([slack(e, curves, speed) for e in episodes])
    done = np.concatenate(succeeded)
    if np.any(done & (spare < 0)):
        raise AssertionError("a task beyond its own dedicated-node bound succeeded")
    out = {}
    for key, lo, hi in slack_bands():
        band = (spare >= lo) & (spare < hi)
        out[key] = float(done[band].mean()) if band.any() else math.nan
    return out


def evaluate(methods: list[Method], task_sets: list[str], loads: list[float], bank: Path,
             env_cfg: EnvConfig, eval_cfg: EvalConfig, scenario: str = "default",
             out_dir: Path | None = None, log_mlflow: bool = True, progress: bool = True,
             tags: dict[str, Any] | None = None, reuse: bool = False) -> list[Record]:
    """Every method on the same frozen episodes; writes results.json / results.md to `out_dir`.

    Runs with one torch thread, whatever the process had set before: the
    thread count changes the FM predictor's and the policy's float sums in
    the last bits, which can flip a near-tie between two tasks, so without
    this the numbers would depend on the machine's cores and on what ran
    earlier in the process (measured: 44.85 vs 44.91 for one cell).

    With `reuse`, a cell whose `cell_key` matches one that `out_dir` already holds keeps
    that record instead of being evaluated again. With an `out_dir`, every cell is also
    appended to its `CELL_JOURNAL` as it finishes, so an evaluation that is stopped resumes
    where it stopped when run again, with or without `reuse` (a journal's cells were
    evaluated on the same inputs by the same code: their keys say so).
    """
    with torch_threads(1):
        cells = planned_cells(methods, task_sets, loads, bank, env_cfg, eval_cfg, scenario)
        # A cell's key is stored beside its record (and matched) only where there is an out_dir.
        episodes = [eval_cfg.split, eval_cfg.roots, eval_cfg.episodes_per_root]
        keys = [cell_key(method, cfg, scenario, episodes) if out_dir is not None else None
                for method, cfg, _ in cells]
        stored = stored_records(Path(out_dir)) if reuse and out_dir is not None else {}
        resumed = journal_records(Path(out_dir)) if out_dir is not None else {}
        known = {**stored, **resumed}
        todo = [i for i, key in enumerate(keys) if key not in known]
        if known and progress:
            tqdm.write(f"evaluate: {len(keys) - len(todo)} of {len(keys)} cells kept from {out_dir} "
                       "(same inputs and code)")
        fresh: dict[int, Record] = {}
        journal = open_journal(Path(out_dir)) if out_dir is not None and todo else None

        def finished(j: int, out: dict) -> None:
            i = todo[j]
            fresh[i] = to_record(cells[i][0], cells[i][1], out, scenario, eval_cfg)
            if journal is not None:
                journal.write(json.dumps({"key": keys[i], "record": asdict(fresh[i])}) + "\n")
                journal.flush()

        try:
            evaluate_cells([cells[i] for i in todo], finished, eval_cfg.workers, progress)
        finally:
            if journal is not None:
                journal.close()
    records = [fresh[i] if i in fresh else known[key] for i, key in enumerate(keys)]
    if out_dir is None and not log_mlflow:  # nothing to record them in
        return records
    inputs = evaluation_inputs(methods, bank)
    if out_dir is not None:
        write_results(records, Path(out_dir), {**inputs, "cells": keys})
        (Path(out_dir) / CELL_JOURNAL).unlink(missing_ok=True)  # every cell is in results.json now
    if log_mlflow:  # the bank and the machine as tags too: runs made from other inputs stand out
        log_records(records, out_dir, {**(tags or {}), **input_tags(inputs)})
    return records


Cell = tuple[Method, EnvConfig, list[list[Episode]]]  # a method on one task set and load's episodes


def planned_cells(methods: list[Method], task_sets: list[str], loads: list[float], bank: Path,
                  env_cfg: EnvConfig, eval_cfg: EvalConfig, scenario: str) -> list[Cell]:
    """Every (task set, load, method) of an evaluation with its env and frozen episodes."""
    cells: list[Cell] = []
    for task_set, load, method in [(ts, load, m) for ts in task_sets for load in loads for m in methods]:
        # Frozen episodes carry their load, so a training load range has no part here.
        cfg = EnvConfig(**{**asdict(env_cfg), "task_set": task_set, "split": eval_cfg.split,
                           "arrival_prob": load, "arrival_prob_max": None, "bank": str(bank)})
        count = 1 if scenario == "stress" else eval_cfg.episodes_per_root
        # Made here, before any worker starts, so that no two processes write one episode file.
        episodes = [frozen_episodes(bank, task_set, eval_cfg.split, load, r, count, cfg.horizon,
                                    cfg.workload, scenario) for r in range(eval_cfg.roots)]
        cells.append((method, cfg, episodes))
    return cells


def to_record(method: Method, cfg: EnvConfig, out: dict, scenario: str, eval_cfg: EvalConfig) -> Record:
    root_means = [float(np.mean(r)) for r in out["per_root"]]
    return Record(
        method=method.name, task_set=cfg.task_set, load=cfg.arrival_prob, scenario=scenario,
        success_rate_mean=float(np.mean(root_means)),
        success_rate_std=float(np.std(root_means, ddof=1)) if len(root_means) > 1 else 0.0,
        per_root=root_means, per_episode=[x for r in out["per_root"] for x in r],
        tasks_per_episode=float(np.mean(out["tasks"])), diagnostics=out["diagnostics"],
        seed=method.seed, split=eval_cfg.split,
    )


def evaluate_cells(cells: list[Cell], finished: Callable[[int, dict], None], workers: int = 0,
                   progress: bool = True) -> None:
    """`evaluate_method` of every cell on up to `workers` processes (0: one per CPU core this
    process may use), handing each result to `finished(i, result)` as cell i finishes.

    A cell is independent of every other (its episodes are frozen, the predictors draw
    fixed samples, the policies act greedily) and runs whole in one process on one torch
    thread, so the results are the same on any number of workers. Workers are spawned,
    not forked: the calling process may hold Ray's or MLflow's threads. Cells whose method
    does not pickle (a lambda written in a test or a probe) keep the evaluation in this process.
    """
    workers = min(workers or len(os.sched_getaffinity(0)), len(cells))
    if workers <= 1 or not all(_pickles(method) for method, _, _ in cells):
        for i, cell in enumerate(tqdm(cells, desc="evaluate", disable=not progress)):
            finished(i, evaluate_method(*cell))
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_evaluate_cell, cell): i for i, cell in enumerate(cells)}
        for future in tqdm(as_completed(futures), total=len(futures), desc="evaluate", disable=not progress):
            finished(futures[future], future.result())


def _evaluate_cell(cell: Cell) -> dict:
    with torch_threads(1):
        return evaluate_method(*cell)


def _pickles(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True
