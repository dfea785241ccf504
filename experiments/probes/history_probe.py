"""Probe: how far would forecasts from the cluster's own history take the teacher?

The FM predictor sees a task's prefix, batch size and learning rate, never
what kind of job it is. A cluster usually knows more: the job's kind and the
loss curves of earlier runs of that kind. `AnalogPredictor` reads the
remaining demand off those runs — the k finished runs of the task's family
whose log loss over the last `window` observed points is closest to the
task's, each shifted to the task's current level — with the same estimate /
optimistic-quantile band as FM (median and the q-quantile of the k
neighbours' crossings; a neighbour that never reaches ε counts as infinite).

This changes the problem: it needs the job's family and a pool of finished
runs of it. For the ID families the pool is their training curves; RL OOD
and ViT OOD have no other split, so there it is the set's other test curves
(every run of that kind but the task's own). It is a bound on what such
history could give, not a method of the evaluation. k and the window are
chosen on ID validation episodes only (the first table); the second table
scores that one setting on the frozen test episodes of the evaluation
(reported, never chosen on).

The profile's [env] must set optimistic_quantile. Run from the project root
(FM: the profile's exported predictor unless --fm):

    python -m experiments.probes.history_probe

Writes experiments/probes/results/history_probe.md, or into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from experiments.probes.common import add_common_flags, add_replay_flags, save_table, success
from mara_common.config import ConfigError
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, load_curves
from mara_env.workload import Episode
from mara_fm.bank import CurveSet
from mara_fm.predictors import (
    WARMUP_POINTS,
    FMPredictor,
    HistoryBatch,
    OraclePredictor,
    first_crossing,
)
from mara_rl.evaluate import pooled_episodes

# (k, window) settings compared on ID validation; None: the whole observed prefix.
SETTINGS = ((5, None), (10, None), (5, 20), (10, 40))
TASK_SETS = ("id", "rl_ood", "vit_ood")


def settle(band: np.ndarray, current: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
           horizon: np.ndarray, with_band: bool) -> np.ndarray:
    """The `Predictor` interface's answer from raw (estimate, optimistic) pairs (B, 2):
    both clipped to [0, horizon], the optimistic one `inf` where it does not come in
    before the horizon; the horizon during the warm-up; 0 once at ε. (B,) without the band."""
    warm, done = lengths < WARMUP_POINTS, current <= eps

    def rule(values: np.ndarray) -> np.ndarray:
        return np.where(done, 0.0, np.where(warm, horizon, values))

    estimate = rule(np.clip(band[:, 0], 0.0, horizon))
    if not with_band:
        return estimate
    low = rule(np.where(band[:, 1] >= horizon, np.inf, np.clip(band[:, 1], 0.0, horizon)))
    return np.stack([estimate, low], axis=1)


class AnalogPredictor(OraclePredictor):
    """Remaining batches read off the nearest finished runs of the task's own family.

    Like the oracle it reads more than the task's prefix (its family, other runs), so it
    answers only the simulator's question, `replay_remaining`, which names each task's
    curve; a bare prefix (`remaining_batches`) carries no family.
    """

    name = "analog"

    def __init__(self, pool: CurveSet, k: int, window: int | None) -> None:
        self.pool, self.k, self.window = pool, k, window
        self.members = {f: np.flatnonzero(pool.families == f) for f in pool.family_names()}

    def remaining_batches(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray,
                          optimistic: float | None = None) -> np.ndarray:
        raise TypeError("AnalogPredictor needs each task's family: ask it through replay_remaining")

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        band = np.array([self.neighbour_band(source, int(r), int(n), float(e), optimistic or 0.0)
                         for r, n, e in zip(rows, lengths, eps, strict=True)]).reshape(len(rows), 2)
        return settle(band, source.avg[rows, lengths - 1], np.asarray(lengths), np.asarray(eps),
                      np.asarray(horizon, np.float64), optimistic is not None)

    def neighbour_band(self, source: CurveSet, row: int, n: int, eps: float,
                       quantile: float) -> tuple[float, float]:
        """(median, quantile) of the k nearest runs' remaining batches to `eps` after n points
        (`inf` where they never reach it)."""
        members = self.members.get(source.families[row], np.zeros(0, np.int64))
        members = members[self.pool.ids[members] != source.ids[row]]  # never the task's own run
        if len(members) == 0:
            raise ValueError(f"no other run of family {source.families[row]!r} in the history pool")
        start = 0 if self.window is None else max(0, n - self.window)
        mine = source.log_avg[row, start:n]
        theirs = self.pool.log_avg[members]
        shift = mine[-1] - theirs[:, n - 1]
        distance = np.mean((theirs[:, start:n] + shift[:, None] - mine) ** 2, axis=1)
        near = np.argsort(distance, kind="stable")[: self.k]
        shifted = np.exp(theirs[near] + shift[near, None])  # the neighbours at the task's level
        crossing = np.sort(first_crossing(shifted, np.full(len(near), n), np.full(len(near), eps),
                                          np.full(len(near), np.inf)))
        return float(np.median(crossing)), float(crossing[round(quantile * (len(crossing) - 1))])


def history_pool(cfg: EnvConfig) -> CurveSet:
    """ID: the families' training runs; an OOD set: its own curves (the task's excluded)."""
    return load_curves(cfg.bank_path, "id", "train") if cfg.task_set == "id" else \
        load_curves(cfg.bank_path, cfg.task_set, cfg.split)


def parse_settings(text: str) -> list[tuple[int, int | None]]:
    """`K:WINDOW,...` (WINDOW `all`: the whole prefix) → [(k, window or None)]."""
    settings = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        k, _, window = item.partition(":")
        if not k.isdigit() or not (window == "all" or window.isdigit()):
            raise ConfigError(f"--settings entry {item!r} should be K:WINDOW, WINDOW a number or 'all'")
        settings.append((int(k), None if window == "all" else int(window)))
    return settings


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_flags(parser)
    add_replay_flags(parser)
    parser.add_argument("--settings", default=",".join(f"{k}:{w or 'all'}" for k, w in SETTINGS),
                        help="(k, window) settings compared on ID val, as K:WINDOW,...")
    parser.add_argument("--test-sets", default=",".join(TASK_SETS),
                        help="task sets of the test table, comma-separated")
    args = parser.parse_args(argv)

    profile = Profile.load(args.profile)
    base = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank))
    if base.optimistic_quantile is None:
        raise ConfigError(f"profile {profile.name!r} has no [env] optimistic_quantile: the teacher needs it")
    settings = parse_settings(args.settings)
    if not settings:
        parser.error("--settings names no setting")
    fm = FMPredictor.load(args.fm or profile.paths.predictor)

    def episodes_of(task_set: str, split: str) -> tuple[EnvConfig, list[Episode]]:
        cfg = dataclasses.replace(base, task_set=task_set, split=split)
        return cfg, pooled_episodes(cfg, args.roots, args.episodes_per_root)

    with torch_threads(1):
        cfg, episodes = episodes_of("id", "val")
        pool = history_pool(cfg)
        lines = [f"Teacher (`lara_optimistic`) success (%) on {len(episodes)} ID validation episodes, "
                 f"p = {cfg.arrival_prob}: FM {success(cfg, episodes, fm):.2f}, true demand "
                 f"{success(cfg, episodes, 'oracle'):.2f}.", "", "| k | window | analog |", "|---|---|---|"]
        scores = {}
        for k, window in settings:
            scores[k, window] = success(cfg, episodes, AnalogPredictor(pool, k, window))
            lines.append(f"| {k} | {window or 'all'} | {scores[k, window]:.2f} |")
            print(lines[-1], flush=True)
        k, window = max(scores, key=scores.get)  # chosen on validation only
        lines += ["", f"Test episodes (the evaluation's {args.roots} roots × {args.episodes_per_root}), "
                  f"k = {k}, window = {window or 'all'}; planners `lara_optimistic` (the teacher) and `llf`:", "",
                  "| task set | teacher: FM | teacher: analog | teacher: true | llf: FM | llf: analog | llf: true |",
                  "|---|---|---|---|---|---|---|"]
        for task_set in (x.strip() for x in args.test_sets.split(",") if x.strip()):
            cfg, episodes = episodes_of(task_set, "test")
            analog = AnalogPredictor(history_pool(cfg), k, window)
            rates = [success(cfg, episodes, p, planner) for planner in ("lara_optimistic", "llf")
                     for p in (fm, analog, "oracle")]
            lines.append(f"| {task_set} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")
            print(lines[-1], flush=True)
    return save_table(lines, args.out, "history_probe.md")


if __name__ == "__main__":
    main()
