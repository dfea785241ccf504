"""Probe: where the teacher's room lies — in the planning or in the forecasts?

Scores three planners on the frozen ID validation episodes — LARA (DESIGN's
Moore–Hodgson test, EDF service), `lara_optimistic` (MARA's teacher: the same
on the optimistic estimate, a never-crossing forecast read as infinite
demand) and `llf` (the exact N-node feasibility test and least-laxity
service) — each fed by WLS, by the FM predictor, by FM with one of its two
kinds of error removed (whether the task reaches its threshold at all, or
how long it takes when both FM and the truth say it does), by the true
remaining demand, and by the true demand with a multiplicative error
exp(σ·z), z ~ N(0, 1) drawn once per task (so the error persists, and
shrinks in batches as the task nears its threshold, like a forecast's).
Where the planners part ways as σ grows says how accurate forecasts must be
before the better planner pays.

With `--by-family`, a second table says where FM's errors lie and what each
family's cost the teacher (`lara_optimistic`): per ID family, how FM reads
its tasks after the teacher's judgement point (the share of tasks that reach
ε which FM's optimistic sample calls reachable, the same share for tasks
that do not, and the typical factor between FM's median and the true demand
where both reach), and the teacher's success with that family's forecasts
replaced by the truth (the other families' stay FM's).

    python experiments/planning_probe.py --no-probe --out reports/default/probe
    python experiments/planning_probe.py --by-family --roots 10 --out reports/default/probe
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from mara_env.env import EnvConfig, load_curves
from mara_env.vector import replay_in_lockstep
from mara_env.workload import curve_rows
from mara_fm.bank import CurveSet
from mara_fm.fm_predictor import FMPredictor
from mara_fm.predictors import WARMUP_POINTS, HistoryBatch
from mara_fm.predictors.oracle import OraclePredictor, first_crossing
from mara_fm.profile import section_config
from mara_rl.evaluate import classic, pooled_episodes
from mara_rl.pipeline import Paths

PLANNERS = ("lara", "lara_optimistic", "llf")


class NoisyOracle(OraclePredictor):
    """The true remaining demand times exp(σ·z), z fixed per task (keyed by its threshold,
    which the workload jitters per task)."""

    def __init__(self, sigma: float, seed: int = 0) -> None:
        self.sigma, self.seed = sigma, seed

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        z = np.array([np.random.default_rng([self.seed, int(e.view(np.int64) & 0x7FFFFFFF)]).standard_normal()
                      for e in eps.astype(np.float64)])
        return super()._predict(hist, eps, horizon) * np.exp(self.sigma * z)


class PartlyTrueFM(FMPredictor):
    """FM's band with one kind of error replaced by the truth: `reach` (whether the task
    reaches ε within the horizon; FM's figures kept, capped below the horizon, for the
    tasks that do) or `amount` (the true demand where FM and the truth both say it does)."""

    def __init__(self, base: FMPredictor, truth: str) -> None:
        super().__init__(base.model, base.cfg, base.stats)
        self.truth = truth

    def _predict_band(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray,
                      quantile: float) -> np.ndarray:
        band = super()._predict_band(hist, eps, horizon, quantile)
        true = first_crossing(hist.future, hist.lengths, eps, horizon)
        reaches = true < horizon
        if self.truth == "reach":
            band[~reaches] = horizon[~reaches, None]
            band[reaches] = np.minimum(band[reaches], horizon[reaches, None] - 1)
        else:
            both = reaches & (band[:, 1] < horizon)
            band[both] = true[both, None]
        return band


class FamilyTruthFM(FMPredictor):
    """FM, except that the tasks of `families` get the true remaining demand."""

    def __init__(self, base: FMPredictor, families: list[str]) -> None:
        super().__init__(base.model, base.cfg, base.stats)
        self.families = families

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        out = super().replay_remaining(source, rows, lengths, eps, horizon, optimistic)
        told = np.isin(source.families[rows], self.families)
        if told.any():
            out[told] = OraclePredictor().replay_remaining(source, rows[told], lengths[told], eps[told],
                                                           horizon[told], optimistic)
        return out


def success(cfg: EnvConfig, episodes: list, predictor: object, planner: str = "lara_optimistic") -> float:
    """Mean success (%) of `planner` on `episodes`, fed by `predictor`."""
    outs = replay_in_lockstep(dataclasses.replace(cfg, predictor=predictor), episodes, classic(planner)())
    return 100 * float(np.mean([o["success_rate"] for o in outs]))


def save_table(lines: list[str], out: Path | None, name: str) -> None:
    """Write a probe's Markdown lines to out/name (nothing without --out)."""
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("\n".join(lines) + "\n")


def by_family(cfg: EnvConfig, episodes: list, fm: FMPredictor) -> list[str]:
    """The per-family table (module docstring): FM's reading after the judgement point, and the
    teacher with one family's forecasts true."""
    curves = load_curves(cfg.bank_path, cfg.task_set, cfg.split)
    rows = np.concatenate([curve_rows(e, curves) for e in episodes])
    eps = np.concatenate([e.eps for e in episodes])
    judged = cfg.probe_points or WARMUP_POINTS
    seen = np.full(len(rows), judged)
    horizon = (curves.cap - seen).astype(np.float64)
    median, low = fm.replay_remaining(curves, rows, seen, eps, horizon, cfg.optimistic_quantile).T
    true = OraclePredictor().replay_remaining(curves, rows, seen, eps, horizon)
    reaches = true < horizon
    lines = [f"Teacher (`lara_optimistic`) on {len(episodes)} ID validation episodes: "
             f"{success(cfg, episodes, fm):.2f}% with FM, "
             f"{success(cfg, episodes, 'oracle'):.2f}% with every task's demand true. "
             f"FM read after {judged} observations.", "",
             "| family | tasks | FM calls reachable: of those that reach | of those that do not "
             "| FM median ÷ true (median, where both reach) | teacher, this family true |",
             "|---|---|---|---|---|---|"]
    for family in curves.family_names():
        mine = curves.families[rows] == family
        both = mine & reaches & (median < horizon) & (true > 0)
        ratio = np.exp(np.median(np.log(np.maximum(median[both], 1.0) / true[both])))
        lines.append(f"| {family} | {mine.sum()} | {np.mean(low[mine & reaches] < np.inf):.2f} "
                     f"| {np.mean(low[mine & ~reaches] < np.inf):.2f} | {ratio:.2f} "
                     f"| {success(cfg, episodes, FamilyTruthFM(fm, [family])):.2f} |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--fm", type=Path, help="exported FM predictor (default: the profile's)")
    parser.add_argument("--sigmas", default="0.1,0.2,0.3,0.5")
    parser.add_argument("--roots", type=int, default=5)
    parser.add_argument("--episodes-per-root", type=int, default=8)
    parser.add_argument("--no-probe", action="store_true",
                        help="judge every task after the predictor's warm-up (ignore the profile's probe_points)")
    parser.add_argument("--by-family", action="store_true",
                        help="the per-family table instead")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    paths = Paths(args.profile)
    cfg = section_config(EnvConfig, args.profile, "env", bank=str(paths.bank), split="val", task_set="id")
    if args.no_probe:
        cfg = dataclasses.replace(cfg, probe_points=None)
    if cfg.optimistic_quantile is None:
        raise ValueError(f"profile {args.profile!r} has no [env] optimistic_quantile: the teacher needs it")
    fm = FMPredictor.load(args.fm or paths.fm)
    if args.by_family:
        save_table(by_family(cfg, pooled_episodes(cfg, args.roots, args.episodes_per_root), fm), args.out,
                   "planning_probe_by_family.md")
        return
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    predictors: dict[str, object] = {"wls": "wls", "fm": fm, "fm, reach from the truth": PartlyTrueFM(fm, "reach"),
                                     "fm, amount from the truth": PartlyTrueFM(fm, "amount"),
                                     "true demand": "oracle"}
    predictors.update({f"true × exp({s}·z)": NoisyOracle(float(s)) for s in args.sigmas.split(",")})
    lines = [f"Success (%) on {len(episodes)} ID validation episodes at p = {cfg.arrival_prob}, "
             f"probe_points = {cfg.probe_points}.", "",
             "| demand from | " + " | ".join(PLANNERS) + " |", "|---|" + "---|" * len(PLANNERS)]
    for label, predictor in predictors.items():
        rates = [success(cfg, episodes, predictor, p) for p in PLANNERS]
        lines.append(f"| {label} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")
        print(lines[-1], flush=True)
    save_table(lines, args.out, "planning_probe.md")


if __name__ == "__main__":
    main()
