"""Probe: where does the teacher's room lie — in the planning or in the forecasts?

Scores three planners on the frozen ID validation episodes — LARA (docs/design.md §6's
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

Validation curves only (ID val); the profile's [env] must set
optimistic_quantile. Run from the project root (FM: the profile's exported
predictor unless --fm):

    python -m experiments.probes.planning_probe --no-probe
    python -m experiments.probes.planning_probe --by-family --roots 10

Writes experiments/probes/results/planning_probe.md (with --by-family,
planning_probe_by_family.md), or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from experiments.probes.common import probe_parser, save_table, success
from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, load_curves
from mara_env.workload import Episode, curve_rows
from mara_fm.bank import CurveSet
from mara_fm.predictors import (
    WARMUP_POINTS,
    FMPredictor,
    OraclePredictor,
    Predictor,
    first_crossing,
)
from mara_rl.evaluate import pooled_episodes

PLANNERS = ("lara", "lara_optimistic", "llf")


class NoisyOracle(OraclePredictor):
    """The true remaining demand times exp(σ·z), z fixed per task (keyed by its threshold,
    which the workload jitters per task).

    A point estimate: its optimistic band is itself, read as never (`inf`) where the
    noisy demand does not come in before the horizon, as the interface reads any band.
    """

    def __init__(self, sigma: float, seed: int = 0) -> None:
        self.sigma, self.seed = sigma, seed

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        true = super().replay_remaining(source, rows, lengths, eps, horizon)  # 0 once at ε
        z = np.array([np.random.default_rng([self.seed, int(e.view(np.int64) & 0x7FFFFFFF)]).standard_normal()
                      for e in np.asarray(eps, np.float64)])
        noisy = true * np.exp(self.sigma * z)
        estimate = np.minimum(noisy, horizon)
        if optimistic is None:
            return estimate
        above = source.avg[rows, lengths - 1] > eps
        return np.stack([estimate, np.where(above & (noisy >= horizon), np.inf, estimate)], axis=1)


class PartlyTrueFM(FMPredictor):
    """FM's band with one kind of error replaced by the truth: `reach` (whether the task
    reaches ε within the horizon; FM's figures kept, capped below the horizon, for the
    tasks that do) or `amount` (the true demand where FM's optimistic sample and the truth
    both say it does). Tasks in warm-up or already at ε keep the interface's answers."""

    def __init__(self, base: FMPredictor, truth: str) -> None:
        if truth not in ("reach", "amount"):
            raise ValueError(f"truth must be 'reach' or 'amount', got {truth!r}")
        super().__init__(base.model, base.cfg, base.stats)
        self.truth = truth

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        if optimistic is None:
            raise ConfigError("PartlyTrueFM corrects FM's band: run it with [env] optimistic_quantile")
        band = super().replay_remaining(source, rows, lengths, eps, horizon, optimistic)
        estimate, low = band[:, 0].copy(), band[:, 1].copy()
        horizon = np.asarray(horizon, np.float64)
        judged = (source.avg[rows, lengths - 1] > eps) & (lengths >= WARMUP_POINTS)
        true = first_crossing(source.avg[rows], lengths, eps, horizon)
        reaches = judged & (true < horizon)
        if self.truth == "reach":
            never = judged & ~reaches
            estimate[never], low[never] = horizon[never], np.inf
            estimate[reaches] = np.minimum(estimate[reaches], horizon[reaches] - 1)
            low[reaches] = np.minimum(low[reaches], horizon[reaches] - 1)
        else:
            both = reaches & np.isfinite(low)
            estimate[both] = low[both] = true[both]
        return np.stack([estimate, low], axis=1)


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


def share(flags: np.ndarray) -> str:
    """The mean of boolean `flags`, or a dash when there are none."""
    return f"{np.mean(flags):.2f}" if len(flags) else "–"


def by_family(cfg: EnvConfig, episodes: list[Episode], fm: FMPredictor) -> list[str]:
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
        ratio = (f"{np.exp(np.median(np.log(np.maximum(median[both], 1.0) / true[both]))):.2f}"
                 if both.any() else "–")
        lines.append(f"| {family} | {mine.sum()} | {share(low[mine & reaches] < np.inf)} "
                     f"| {share(low[mine & ~reaches] < np.inf)} | {ratio} "
                     f"| {success(cfg, episodes, FamilyTruthFM(fm, [family])):.2f} |")
        print(lines[-1], flush=True)
    return lines


def by_predictor(cfg: EnvConfig, episodes: list[Episode], fm: FMPredictor, sigmas: list[float]) -> list[str]:
    """The main table (module docstring): each planner fed by each predictor."""
    predictors: dict[str, str | Predictor] = {
        "wls": "wls", "fm": fm, "fm, reach from the truth": PartlyTrueFM(fm, "reach"),
        "fm, amount from the truth": PartlyTrueFM(fm, "amount"), "true demand": "oracle"}
    predictors.update({f"true × exp({s:g}·z)": NoisyOracle(s) for s in sigmas})
    lines = [f"Success (%) on {len(episodes)} ID validation episodes at p = {cfg.arrival_prob}, "
             f"probe_points = {cfg.probe_points}.", "",
             "| demand from | " + " | ".join(PLANNERS) + " |", "|---|" + "---|" * len(PLANNERS)]
    for label, predictor in predictors.items():
        rates = [success(cfg, episodes, predictor, p) for p in PLANNERS]
        lines.append(f"| {label} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True, roots=True)
    parser.add_argument("--sigmas", default="0.1,0.2,0.3,0.5", help="σ of the noisy true demand, comma-separated")
    parser.add_argument("--no-probe", action="store_true",
                        help="judge every task after the predictor's warm-up (ignore the profile's probe_points)")
    parser.add_argument("--by-family", action="store_true", help="the per-family table instead")
    args = parser.parse_args(argv)

    profile = Profile.load(args.profile)
    cfg = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), split="val", task_set="id")
    if args.no_probe:
        cfg = dataclasses.replace(cfg, probe_points=None)
    if cfg.optimistic_quantile is None:
        raise ConfigError(f"profile {profile.name!r} has no [env] optimistic_quantile: the teacher needs it")
    fm = FMPredictor.load(args.fm or profile.paths.predictor)
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    with torch_threads(1):
        if args.by_family:
            return save_table(by_family(cfg, episodes, fm), args.out, "planning_probe_by_family.md")
        sigmas = comma_list(args.sigmas, "--sigmas", float)
        return save_table(by_predictor(cfg, episodes, fm, sigmas), args.out, "planning_probe.md")


if __name__ == "__main__":
    main()
