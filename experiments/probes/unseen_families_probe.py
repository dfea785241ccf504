"""Probe: what a predictor's forecasts for families it never saw are worth to the scheduler.

`select_predictor.py` ranks predictors by held-out capped MAE; this probe asks
the scheduler's question on the same folds. For each fold it writes the held-out
families' train + val curves as a bank of their own (task set `heldout`, split
`val`), draws frozen episodes from it with the profile's workload, and replays
the teacher (`lara_optimistic`) and LARA on them, their env fed by each
candidate's predictor trained without those families (its last checkpoint, as
`select_predictor.py` scores it). These are the scheduler's validation episodes
for unseen job kinds: no test or OOD curve is read. Beside them, each candidate
trained on every family it may use (exported as `train-predictor` would export
it) drives the teacher on the frozen ID val episodes.

The table's `weighted` column is the teacher's success weighted as the test
mean weighs the task sets: one third on the ID families (ID val), two thirds
on families the predictor never saw (the folds' mean).

`--crossing-scales` also tries each candidate with its sampled crossings (remaining
batches) multiplied by a factor, capped at the horizon: a correction of the low
bias FM's samples show on families it never saw, chosen here on the folds like
everything else (1 = the predictor as trained).

`--sampler-seeds 0,1,2` averages the teacher's and LARA's success over those
draws of FM's base noise, which move them about as much as the network does;
the MAE and calibration columns stay at each predictor's own draw, as
`select_predictor.py` scores it.

Below the table, the rank correlation within each fold of the held-out MAE and
the teacher's success, over every predictor scored: whether the selection's
measure orders predictors as the scheduler does.

With `--seeds N` every candidate is scored in N training replicates (its own
seeds, as in `select_predictor.py`): the table gives their mean and each
replicate's weighted score, since one training seed alone moves that score
about as much as the candidates differ.

It takes `select_predictor.py`'s grid and fold flags and reuses its --work folder
(candidates it has not trained are trained first). Run from the project root:

    python -m experiments.probes.unseen_families_probe --work /tmp/wsel --networks small \\
        --epochs 25 --priors off,mixture --data id,wide --folds gcn_blocks+tfm_charlm,...

Writes experiments/probes/results/unseen_families_probe.md, or into --out.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.probes.common import capped_mae, probe_parser, save_table, success
from experiments.probes.select_predictor import (
    add_grid_flags,
    fold_predictor,
    full_predictor,
    heldout_curves,
    heldout_queries,
    label,
    parse_selection,
)
from mara_common.flags import comma_list
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig
from mara_env.workload import Episode
from mara_fm.bank import CurveSet, save_bank
from mara_fm.eval_predictor import Queries, calibration_max_dev, crossing_samples, reliability
from mara_fm.predictors import SampledPredictor
from mara_fm.predictors.base import HistoryBatch
from mara_rl.evaluate import pooled_episodes

PLANNERS = {"teacher": "lara_optimistic", "LARA": "lara"}


class ScaledFM(SampledPredictor):
    """FM (or an ensemble of FM) with every sampled crossing multiplied by `scale` (capped at the horizon)."""

    def __init__(self, base: SampledPredictor, scale: float) -> None:
        self.base, self.scale = base, scale

    @property
    def samples(self) -> int:
        return self.base.samples

    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        return np.minimum(self.base.sorted_crossings(hist, eps, horizon) * self.scale, horizon[:, None])

    def resampled(self, sampler_seed: int) -> ScaledFM:
        return ScaledFM(self.base.resampled(sampler_seed), self.scale)


def scaled(predictor: SampledPredictor, scale: float) -> SampledPredictor:
    return predictor if scale == 1 else ScaledFM(predictor, scale)


def success_over_draws(cfg: EnvConfig, episodes: list[Episode], predictor: SampledPredictor, draws: list[int] | None,
                       planner: str = "lara_optimistic") -> float:
    """Mean success (%) of `planner` fed by `predictor` at each of FM's sampler seeds `draws`
    (None: its own draw alone)."""
    if draws is None:
        return success(cfg, episodes, predictor, planner)
    return float(np.mean([success(cfg, episodes, predictor.resampled(d), planner) for d in draws]))


def heldout_calibration(predictor: SampledPredictor, queries: Queries) -> tuple[float, np.ndarray]:
    """On held-out `queries`: the largest |share − k/(M+1)| of the reliability curve, and the
    curve (for sample k, the share of queries whose true demand lies below it)."""
    shares = reliability(crossing_samples(predictor, queries, predictor.samples), queries.truth)
    return calibration_max_dev(shares), shares


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ of `x` and `y` (ties share their mean rank); nan when either is constant."""
    def ranks(v: np.ndarray) -> np.ndarray:
        r = np.empty(len(v))
        r[np.argsort(v, kind="stable")] = np.arange(len(v))
        for value in np.unique(v):
            r[v == value] = r[v == value].mean()
        return r

    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def heldout_bank(frame: pd.DataFrame, curves: CurveSet, out: Path) -> Path:
    """`curves` (a fold's train + val curves, rows of `frame`) as a bank of task set `heldout`, split `val`."""
    rows = frame[frame["curve_id"].isin(set(curves.ids))].assign(task_set="heldout", split="val")
    return save_bank(rows.sort_values("curve_id", ignore_index=True), out)


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, roots=True)
    parser.add_argument("--crossing-scales", default="1",
                        help="comma-separated factors on FM's sampled crossings, each tried with every candidate")
    parser.add_argument("--sampler-seeds", default="",
                        help="FM's base-noise draws (sampler seeds) the teacher and LARA are averaged over, "
                             "comma-separated (default: each predictor's own draw)")
    add_grid_flags(parser)
    args, sel = parse_selection(parser, argv)
    draws = comma_list(args.sampler_seeds, "--sampler-seeds", int) or None
    scales = comma_list(args.crossing_scales, "--crossing-scales", float)
    if not scales or min(scales) <= 0:
        parser.error("--crossing-scales: positive factors, comma-separated")
    profile, bank, folds = sel.profile, sel.bank, sel.folds
    base = profile.section(EnvConfig, "env", split="val", task_set="heldout")
    id_val = profile.section(EnvConfig, "env", bank=str(bank), split="val", task_set="id")
    id_episodes = pooled_episodes(id_val, args.roots, args.episodes_per_root)
    labels = {(name, size, scale): label(name, size) + (f" x{scale:g}" if scale != 1 else "")
              for name, size in sel.trained_as for scale in scales}
    replicates = range(sel.seeds)
    on_id: dict[str, list[float]] = {shown: [] for shown in labels.values()}  # one per training replicate
    for (name, size), r in itertools.product(sel.trained_as, replicates):  # one predictor, every scale
        full = full_predictor(sel, args.work, name, size, r)
        for scale in scales:
            shown = labels[name, size, scale]
            with torch_threads(1):
                on_id[shown].append(success_over_draws(id_val, id_episodes, scaled(full, scale), draws))
            print(f"[unseen] {shown} (replicate {r}) on ID val: teacher {on_id[shown][-1]:.2f}", flush=True)
    # rows[shown][fold]: one row per training replicate
    rows: dict[str, dict[tuple[str, ...], list[dict[str, float]]]] = {shown: {} for shown in labels.values()}
    shares: dict[str, list[np.ndarray]] = {shown: [] for shown in labels.values()}
    for fold in folds:
        curves = heldout_curves(sel.frame, fold)
        path = heldout_bank(sel.frame, curves, args.work / f"heldout-{'+'.join(fold)}.parquet")
        cfg = dataclasses.replace(base, bank=str(path))
        episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
        queries = heldout_queries(curves)
        for (name, size), r in itertools.product(sel.trained_as, replicates):  # one predictor, every scale
            trained = fold_predictor(sel, args.work, name, fold, size, r)
            for scale in scales:
                predictor, shown = scaled(trained, scale), labels[name, size, scale]
                with torch_threads(1):
                    row = {kind: success_over_draws(cfg, episodes, predictor, draws, planner)
                           for kind, planner in PLANNERS.items()}
                row["mae"] = capped_mae(predictor, queries)
                row["calib"], curve = heldout_calibration(predictor, queries)
                rows[shown].setdefault(fold, []).append(row)
                shares[shown].append(curve)
                print(f"[unseen] {'+'.join(fold)} {shown} (replicate {r}): "
                      + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
    lines = [f"Folds: {'; '.join(', '.join(f) for f in folds)}. Each fold: {args.roots} x {args.episodes_per_root} "
             "episodes from the held-out families' train + val curves at the profile's load; predictors trained "
             "without those families (last checkpoint). Success %, mean over folds (per fold in brackets) and "
             f"{sel.seeds} training replicate(s)" + ("" if draws is None else f", each at FM's sampler seeds {draws}")
             + ("" if sel.sampling is None else
                f"; fold predictors draw {sel.sampling[0]} crossings with {sel.sampling[1]} Euler steps")
             + ". `ID val`: the teacher on the ID val episodes with the candidate trained on all its families. "
             "`weighted` per replicate: each training replicate's own.", "",
             "| candidate | teacher, unseen | LARA, unseen | held-out MAE | calib. dev | teacher, ID val | weighted "
             "| weighted per replicate |",
             "|---|---|---|---|---|---|---|---|"]
    for name, by_fold in rows.items():
        measure = {k: np.array([[reps[r][k] for reps in by_fold.values()] for r in replicates])
                   for k in ("teacher", "LARA", "mae", "calib")}  # each a [replicate, fold] array
        cells = [f"{measure[k].mean():.2f} ({' / '.join(f'{x:.1f}' for x in measure[k].mean(axis=0))})"
                 for k in ("teacher", "LARA", "mae")]
        weighted = (np.array(on_id[name]) + 2 * measure["teacher"].mean(axis=1)) / 3
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {measure['calib'].mean():.3f} | "
                     f"{np.mean(on_id[name]):.2f} | {weighted.mean():.2f} | "
                     + " / ".join(f"{w:.2f}" for w in weighted) + " |")
    # Does the selection's measure order predictors as the teacher does? Within each fold (one set
    # of episodes), over every predictor scored there (candidates, scales, replicates).
    pairs = {fold: np.array([(row["mae"], row["teacher"]) for by_fold in rows.values() for row in by_fold[fold]])
             for fold in folds}
    rho = np.array([rank_correlation(mae, teacher) for mae, teacher in (pairs[f].T for f in folds)])
    mean_rho = float(np.mean(rho[~np.isnan(rho)])) if (~np.isnan(rho)).any() else float("nan")
    lines += ["", f"Within a fold, over its {len(pairs[folds[0]])} predictors: rank correlation (Spearman) of the "
              f"held-out MAE and the teacher's success, mean over folds {mean_rho:+.2f} (per fold "
              f"{' / '.join(f'{x:+.2f}' for x in rho)}; nan: a constant column). A measure that ordered the "
              "predictors as the teacher does would read −1."]
    lines += ["", "Reliability on the held-out curves, mean over folds and replicates (share of queries whose true "
              "demand lies below the k-th smallest of the M samples; calibrated: k/(M+1)):", ""]
    for name, curves_of in shares.items():
        curve = np.mean(curves_of, axis=0)
        nominal = np.arange(1, len(curve) + 1) / (len(curve) + 1)
        lines.append(f"- {name}: " + ", ".join(f"{s:.2f} ({n:.2f})" for s, n in zip(curve, nominal, strict=True)))
    print("\n".join(lines))
    return save_table(lines, args.out, "unseen_families_probe.md")


if __name__ == "__main__":
    main()
