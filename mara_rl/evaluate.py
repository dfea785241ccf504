"""Evaluate allocators on frozen, shared episodes (DESIGN §8).

Episodes are generated once per (bank, task set, split, load, root), saved
under `data/episodes/`, and replayed by every method, so differences between
methods are paired. A method is a decision rule plus the predictor inside
the env (LARA reads WLS predictions, LARA-FM reads FM predictions).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mara_env.allocators import ALLOCATORS
from mara_env.env import VIEW_OPTIONS, EnvConfig, load_curves
from mara_env.vector import BatchDecide, replay_in_lockstep
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
from mara_fm.bank import CurveSet
from mara_fm.profile import PROJECT_ROOT
from mara_fm.tracking import mlflow_run

EPISODE_DIR = PROJECT_ROOT / "data" / "episodes"
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
    roots: int = 5
    episodes_per_root: int = 8
    split: str = "test"
    # Training seeds of each learned scheduler that `mara reproduce` trains and evaluates.
    scheduler_seeds: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class Method:
    """How a method decides, and which predictor the env runs for it."""

    name: str
    predictor: str
    make: Callable[[], BatchDecide] | None  # None: the Oracle bound, not simulated
    seed: int | None = None  # scheduler training seed; None for methods that are not trained
    # The env's `VIEW_OPTIONS` the method runs with; those not named are off (DESIGN's observation).
    view: dict[str, Any] = field(default_factory=dict)


def classic(name: str) -> Callable[[], BatchDecide]:
    def make() -> BatchDecide:
        allocator = ALLOCATORS[name]()
        return lambda obs, envs: np.stack([allocator.act(env.scheduler_view()) for env in envs])

    return make


def learned(name: str, policy_dir: str | Path, seed: int | None = None) -> Method:
    """An exported MAT policy, run with the predictor it was trained with.

    Several policies may share `name` with different training `seed`s: their
    records then differ only in `Record.seed`, so seeds are paired by value.
    """
    from mara_rl.train_scheduler import act, load_policy, policy_env

    def make() -> BatchDecide:
        module = load_policy(policy_dir)
        return lambda obs, envs: act(module, obs)

    trained_in = policy_env(policy_dir)
    return Method(name, trained_in.pop("predictor"), make, seed, trained_in)


def builtin_methods(fm_path: str | None = None, view: dict[str, Any] | None = None) -> dict[str, Method]:
    """The non-learned methods; `lara_fm` with an FM predictor, `lara_fm_optimistic` with that
    and an optimistic quantile in `view` (the profile's `EnvConfig.view_options`; it runs with
    all of them, as MARA's teacher), `llf_oracle` with the quantile."""
    view = view or {}
    optimistic_quantile = view.get("optimistic_quantile")
    methods = {
        "fifo": Method("fifo", "wls", classic("fifo")),
        "edf": Method("edf", "wls", classic("edf")),
        "lara": Method("lara", "wls", classic("lara")),
        # LARA fed the true remaining demand: the room a better predictor can win.
        "lara_oracle": Method("lara_oracle", "oracle", classic("lara")),
        "oracle": Method("oracle", "oracle", None),
    }
    if fm_path:
        methods["lara_fm"] = Method("lara_fm", f"fm:{fm_path}", classic("lara"))
    if optimistic_quantile is not None:
        # Exact feasibility and least-laxity service on the true demand: how close planning
        # on exact information comes to the Oracle bound.
        methods["llf_oracle"] = Method("llf_oracle", "oracle", classic("llf"),
                                       view={"optimistic_quantile": optimistic_quantile})
    if fm_path and optimistic_quantile is not None:
        # LARA-FM planning on the optimistic quantile of FM's samples: MARA's imitation teacher.
        methods["lara_fm_optimistic"] = Method("lara_fm_optimistic", f"fm:{fm_path}", classic("lara_optimistic"),
                                               view=view)
    return methods


def episode_root_seed(task_set: str, split: str, load: float, root: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([root, round(load * 10_000), *map(ord, f"{task_set}/{split}")])


def frozen_episodes(bank: Path, task_set: str, split: str, load: float, root: int, count: int,
                    horizon: int, workload: WorkloadConfig, scenario: str = "default") -> list[Episode]:
    """Load the frozen episodes of one root, generating and saving them the first time."""
    tag = "stress" if scenario == "stress" else f"p{load:.3f}"
    # The workload and horizon are part of the key: changing them never reuses stale episodes.
    key = hashlib.sha1(json.dumps([asdict(workload), horizon]).encode()).hexdigest()[:8]
    path = EPISODE_DIR / f"{bank.stem}-{key}" / f"{task_set}-{split}-{tag}-root{root}.json"
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


@dataclass
class Record:
    method: str
    task_set: str
    load: float
    scenario: str
    success_rate_mean: float
    success_rate_std: float  # sample std over evaluation roots
    per_root: list[float]
    per_episode: list[float]
    tasks_per_episode: float
    diagnostics: dict[str, float] = field(default_factory=dict)
    seed: int | None = None  # the method's training seed; per_episode is in the same order for all
    split: str = "test"  # which curves the episodes came from ("val" for choices made on results)


def evaluate_method(method: Method, env_cfg: EnvConfig, episodes: list[list[Episode]]) -> dict:
    """Success rates (per episode, grouped by root) and mean diagnostics."""
    per_root: list[list[float]] = []
    diag: dict[str, list[float]] = {k: [] for k in DIAGNOSTICS}
    tasks: list[int] = []
    if method.make is None:
        curves = load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split)
        for root_eps in episodes:
            per_root.append([oracle_successes(e, curves) / max(len(e), 1) for e in root_eps])
            tasks += [len(e) for e in root_eps]
        return {"per_root": per_root, "diagnostics": {}, "tasks": tasks}
    cfg = EnvConfig(**{**asdict(env_cfg), **dict.fromkeys(VIEW_OPTIONS), **method.view,
                       "predictor": method.predictor, "strict": True})
    flat = [ep for root_eps in episodes for ep in root_eps]
    outs = replay_in_lockstep(cfg, flat, method.make())
    completion = completion_by_slack(flat, [out["succeeded"] for out in outs],
                                     load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split))
    for root_eps in episodes:
        root_outs, outs = outs[:len(root_eps)], outs[len(root_eps):]
        per_root.append([out["success_rate"] for out in root_outs])
        tasks += [out["episode_tasks"] for out in root_outs]
        for k in DIAGNOSTICS:
            diag[k] += [out[k] for out in root_outs]
    means = {k: float(np.nanmean(v)) if len(v) else math.nan for k, v in diag.items()}
    return {"per_root": per_root, "tasks": tasks, "diagnostics": {**means, **completion}}


def completion_by_slack(episodes: list[Episode], succeeded: list[np.ndarray], curves: CurveSet) -> dict[str, float]:
    """Share of the feasible tasks in each slack band that succeeded (NaN for an empty band)."""
    spare = np.concatenate([slack(e, curves) for e in episodes])
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
             out_dir: Path | None = None, log_mlflow: bool = True, progress: bool = True) -> list[Record]:
    """Every method on the same frozen episodes; writes results.json / results.md to `out_dir`.

    Runs with one torch thread, whatever the process had set before: the
    thread count changes the FM predictor's and the policy's float sums in
    the last bits, which can flip a near-tie between two tasks, so without
    this the numbers would depend on the machine's cores and on what ran
    earlier in the process (measured: 44.85 vs 44.91 for one cell).
    """
    from mara_fm.fm_predictor import torch_threads

    with torch_threads(1):
        records = _evaluate(methods, task_sets, loads, bank, env_cfg, eval_cfg, scenario, progress)
    if out_dir is not None:
        write_results(records, Path(out_dir))
    if log_mlflow:
        log_records(records, out_dir)
    return records


def _evaluate(methods: list[Method], task_sets: list[str], loads: list[float], bank: Path,
              env_cfg: EnvConfig, eval_cfg: EvalConfig, scenario: str, progress: bool) -> list[Record]:
    records: list[Record] = []
    combos = [(ts, load, m) for ts in task_sets for load in loads for m in methods]
    for task_set, load, method in tqdm(combos, desc="evaluate", disable=not progress):
        cfg = EnvConfig(**{**asdict(env_cfg), "task_set": task_set, "split": eval_cfg.split,
                           "arrival_prob": load, "bank": str(bank)})
        count = 1 if scenario == "stress" else eval_cfg.episodes_per_root
        episodes = [frozen_episodes(bank, task_set, eval_cfg.split, load, r, count, cfg.horizon,
                                    cfg.workload, scenario) for r in range(eval_cfg.roots)]
        out = evaluate_method(method, cfg, episodes)
        root_means = [float(np.mean(r)) for r in out["per_root"]]
        records.append(Record(
            method=method.name, task_set=task_set, load=load, scenario=scenario,
            success_rate_mean=float(np.mean(root_means)),
            success_rate_std=float(np.std(root_means, ddof=1)) if len(root_means) > 1 else 0.0,
            per_root=root_means, per_episode=[x for r in out["per_root"] for x in r],
            tasks_per_episode=float(np.mean(out["tasks"])), diagnostics=out["diagnostics"],
            seed=method.seed, split=eval_cfg.split,
        ))
    return records


def markdown_table(records: list[Record]) -> str:
    lines = ["| method | task set | load | scenario | success % (mean ± std) | tasks/ep | "
             "utilisation | full queue | waiting | readiness |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    def fmt(d: dict[str, float], key: str, scale: float = 1.0, digits: int = 2) -> str:
        v = d.get(key, math.nan)
        return "–" if math.isnan(v) else f"{v * scale:.{digits}f}"

    for r in records:
        d = r.diagnostics
        method = r.method if r.seed is None else f"{r.method} (seed {r.seed})"
        task_set = r.task_set if r.split == "test" else f"{r.task_set} ({r.split})"
        lines.append(
            f"| {method} | {task_set} | {r.load:.2f} | {r.scenario} | "
            f"{100 * r.success_rate_mean:.2f} ± {100 * r.success_rate_std:.2f} | "
            f"{r.tasks_per_episode:.2f} | {fmt(d, 'utilisation', 100, 1)} | "
            f"{fmt(d, 'full_queue_fraction', 100, 1)} | {fmt(d, 'waiting_population')} | "
            f"{fmt(d, 'readiness_steps', 1, 1)} |"
        )
    return "\n".join(lines) + "\n"


def write_results(records: list[Record], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps([asdict(r) for r in records], indent=1))
    (out_dir / "results.md").write_text(markdown_table(records))


def log_records(records: list[Record], out_dir: Path | None) -> None:
    """One MLflow run per record, with the same metric names, for the compare view."""
    for r in records:
        tags = {"method": r.method, "task_set": r.task_set, "load": r.load, "scenario": r.scenario,
                "split": r.split}
        name = f"{r.method}-{r.task_set}-p{r.load:.2f}-{r.scenario}" + ("" if r.split == "test" else f"-{r.split}")
        if r.seed is not None:
            tags["seed"] = r.seed
            name += f"-seed{r.seed}"
        with mlflow_run("mara-evaluation", name, tags) as _:
            import mlflow

            mlflow.log_params(tags)
            metrics = {"success_rate_mean": r.success_rate_mean,
                       "success_rate_std": r.success_rate_std,
                       "tasks_per_episode": r.tasks_per_episode}
            metrics.update({k: v for k, v in r.diagnostics.items() if not math.isnan(v)})
            mlflow.log_metrics(metrics)
            if out_dir is not None:
                mlflow.log_artifact(str(out_dir / "results.md"))
