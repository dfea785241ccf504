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
history could give, not a method of the evaluation. k and the window were
chosen on ID validation episodes only (the first table); the second table
scores that one setting on the frozen test episodes of the evaluation.

    python experiments/history_probe.py --out reports/default/probe
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from planning_probe import save_table, success

from mara_env.env import EnvConfig, load_curves
from mara_fm.bank import CurveSet
from mara_fm.fm_predictor import FMPredictor, torch_threads
from mara_fm.predictors import first_crossing
from mara_fm.predictors.base import HistoryBatch, Predictor
from mara_fm.profile import section_config
from mara_rl.evaluate import pooled_episodes
from mara_rl.pipeline import Paths

# (k, window) settings compared on ID validation; None: the whole observed prefix.
SETTINGS = ((5, None), (10, None), (5, 20), (10, 40))


class AnalogPredictor(Predictor):
    """Remaining batches read off the nearest finished runs of the task's own family."""

    name = "analog"

    def __init__(self, pool: CurveSet, k: int, window: int | None) -> None:
        self.pool, self.k, self.window = pool, k, window
        self.members = {f: np.flatnonzero(pool.families == f) for f in pool.family_names()}

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        raise TypeError("AnalogPredictor needs each task's family: ask it through replay_remaining")

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        horizon = np.asarray(horizon, np.float64)
        band = np.stack([self._band(source, int(r), int(n), float(e), optimistic or 0.0)
                         for r, n, e in zip(rows, lengths, eps, strict=True)])
        band = np.where(np.isinf(band), horizon[:, None] + 1, band)  # never: past the horizon
        raw = band if optimistic is not None else band[:, 0]
        return self._settle(raw, source.avg[rows, lengths - 1], np.asarray(lengths), np.asarray(eps), horizon)

    def _band(self, source: CurveSet, row: int, n: int, eps: float, quantile: float) -> tuple[float, float]:
        """(median, quantile) of the k nearest runs' remaining batches to `eps` after n points."""
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--roots", type=int, default=5)
    parser.add_argument("--episodes-per-root", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    paths = Paths(args.profile)
    base = section_config(EnvConfig, args.profile, "env", bank=str(paths.bank))
    if base.optimistic_quantile is None:
        raise ValueError(f"profile {args.profile!r} has no [env] optimistic_quantile: the teacher needs it")
    fm = FMPredictor.load(paths.fm)

    def episodes_of(task_set: str, split: str) -> tuple[EnvConfig, list]:
        cfg = dataclasses.replace(base, task_set=task_set, split=split)
        return cfg, pooled_episodes(cfg, args.roots, args.episodes_per_root)

    cfg, episodes = episodes_of("id", "val")
    pool = history_pool(cfg)
    lines = [f"Teacher (`lara_optimistic`) success (%) on {len(episodes)} ID validation episodes, "
             f"p = {cfg.arrival_prob}: FM {success(cfg, episodes, fm):.2f}, true demand "
             f"{success(cfg, episodes, 'oracle'):.2f}.", "", "| k | window | analog |", "|---|---|---|"]
    scores = {}
    for k, window in SETTINGS:
        scores[k, window] = success(cfg, episodes, AnalogPredictor(pool, k, window))
        lines.append(f"| {k} | {window or 'all'} | {scores[k, window]:.2f} |")
        print(lines[-1], flush=True)
    k, window = max(scores, key=scores.get)
    lines += ["", f"Test episodes (the evaluation's {args.roots} roots × {args.episodes_per_root}), "
              f"k = {k}, window = {window or 'all'}; planners `lara_optimistic` (the teacher) and `llf`:", "",
              "| task set | teacher: FM | teacher: analog | teacher: true | llf: FM | llf: analog | llf: true |",
              "|---|---|---|---|---|---|---|"]
    for task_set in ("id", "rl_ood", "vit_ood"):
        cfg, episodes = episodes_of(task_set, "test")
        analog = AnalogPredictor(history_pool(cfg), k, window)
        rates = [success(cfg, episodes, p, planner) for planner in ("lara_optimistic", "llf")
                 for p in (fm, analog, "oracle")]
        lines.append(f"| {task_set} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")
        print(lines[-1], flush=True)
    save_table(lines, args.out, "history_probe.md")


if __name__ == "__main__":
    with torch_threads(1):
        main()
