"""Probe: how well could a predictor forecast a job that it had seen run before, exactly as it is?

FM reads a job's loss so far, its batch size and learning rate; its forecast
errors are per task, not per family (docs/experiments.md, "The predictor's
generality"). This probe asks how much of that error any reader of the past
could remove. Each ID validation curve gets R *twins*: the same family,
batch size and learning rate trained again from other initial weights and
another data order (training seeds that no bank uses). A twin forecast
knows more than any predictor the project can deploy: the job's exact
configuration and R finished runs of it.

Queries follow the predictor evaluation's protocol (`eval_predictor.make_queries`,
thresholds from the ID train curves) on the ID val curves; no test or OOD
curve is read. Forecasts scored, capped MAE and budget-success accuracy:
- `wls`, `fm` (the profile's exported FM, its own sampling);
- `history` (when the profile has a `[history_bank]`): the history
  predictor (docs/design.md §5.5) told each task's family, reading other runs
  of the same kind, at other batch sizes and learning rates; `history, kinds
  withheld`: the same predictor over the same runs, every run and task of one
  kind, so the nearest runs are found by the prefix alone;
- `twins`: the median of the twins' crossings of ε after n, as the twins are;
- `twins, shifted`: each twin first moved in log space so that its point n
  equals the query's current cumulative average (as `HistoryPredictor` moves
  its neighbours), so the forecast also reads the task's own prefix.

Run from the project root:

    python -m experiments.probes.twins_probe --twins 4

Writes experiments/probes/results/twins_probe.md, or into --out.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.probes.common import probe_parser, save_table
from mara_common.profile import Profile
from mara_fm.bank import load_bank
from mara_fm.build_bank import EVERY_FAMILY, curve_seed, ensure_history_bank
from mara_fm.eval_predictor import Queries, make_queries, reference_curves, score
from mara_fm.fm_data import split_curves
from mara_fm.predictors import FMPredictor, HistoryPredictor, WLSPredictor, first_crossing
from mara_fm.predictors.history import history_pool

TWIN_ROOT = 7_000_000  # root of the twins' training seeds; no bank's `[bank] seed` is this
ANY = "any job"  # the one kind of the history rows told no kinds


def twin_losses(family: str, seed: int, batch_size: int, lr: float, cap: int) -> np.ndarray:
    """Per-batch losses of `family` at (batch_size, lr) trained for `cap` batches from `seed`."""
    return EVERY_FAMILY[family].run(seed, cap, (batch_size, lr))["losses"]


def train_twins(curves: pd.DataFrame, twins: int, cap: int, workers: int) -> np.ndarray:
    """(n curves, twins, cap) cumulative averages of every curve's twins, in `curves`' row order."""
    jobs = [(row.family, curve_seed(TWIN_ROOT + r, row.family, int(row.seed)), int(row.batch_size), float(row.lr),
             cap) for row in curves.itertuples() for r in range(twins)]
    if workers == 1:
        losses = np.stack([twin_losses(*job) for job in jobs])
    else:
        with mp.get_context("spawn").Pool(workers) as pool:
            losses = np.stack(pool.starmap(twin_losses, jobs, chunksize=4))
    avg = np.cumsum(losses, axis=1) / np.arange(1, cap + 1)
    return avg.reshape(len(curves), twins, cap)


def twin_forecast(twins: np.ndarray, q: Queries, shifted: bool) -> np.ndarray:
    """Each query's median twin crossing of ε after n, capped at its horizon; `shifted` moves
    every twin (in log space) to the query's current level first."""
    mine = twins[q.curve]  # (B, R, cap)
    b, r, _ = mine.shape
    n = q.hist.lengths
    if shifted:
        level = q.hist.avg[np.arange(b), n - 1]
        mine = mine * (level[:, None] / mine[np.arange(b), :, n - 1])[:, :, None]
    crossings = first_crossing(mine.reshape(b * r, -1), np.repeat(n, r), np.repeat(q.eps, r),
                               np.repeat(q.horizon, r))
    return np.median(crossings.reshape(b, r), axis=1)


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True)
    parser.add_argument("--twins", type=int, default=4, help="runs of each validation job trained again")
    parser.add_argument("--workers", type=int, default=2, help="processes training the twins")
    args = parser.parse_args(argv)
    if args.twins < 1 or args.workers < 1:
        parser.error("--twins and --workers: at least 1")

    profile = Profile.load(args.profile)
    frame = load_bank(args.bank or profile.paths.bank)
    train, val = split_curves(frame)
    rows = frame.set_index("curve_id").loc[val.ids].reset_index()
    twins = train_twins(rows, args.twins, val.cap, args.workers)
    q = make_queries(val, reference_curves(val, train))
    fm = FMPredictor.load(args.fm or profile.paths.predictor)
    forecasts = {"wls": WLSPredictor().remaining_batches(q.hist, q.eps, q.horizon),
                 "fm": fm.remaining_batches(q.hist, q.eps, q.horizon)}
    history_bank = ensure_history_bank(profile)
    if history_bank is not None:  # a profile without [history_bank] has no history rows; queries carry kinds
        pool = history_pool(history_bank)
        forecasts["history"] = HistoryPredictor(pool).remaining_batches(q.hist, q.eps, q.horizon)
        forecasts["history, kinds withheld"] = HistoryPredictor(dataclasses.replace(
            pool, families=np.full(len(pool), ANY))).remaining_batches(
            dataclasses.replace(q.hist, kind=np.full(len(q), ANY)), q.eps, q.horizon)
    forecasts["twins"] = twin_forecast(twins, q, shifted=False)
    forecasts["twins, shifted"] = twin_forecast(twins, q, shifted=True)
    base = score(forecasts["wls"], q)["capped_mae"]
    lines = [f"ID val: {len(val)} curves, {len(q)} queries (eval_predictor's protocol); {args.twins} twins per "
             "curve (same family, batch size and learning rate; other weights and data order).", "",
             "| forecast | capped MAE | vs WLS | budget acc. |", "|---|---|---|---|"]
    for name, pred in forecasts.items():
        s = score(pred, q)
        lines.append(f"| {name} | {s['capped_mae']:.2f} | {s['capped_mae'] / base - 1:+.1%} "
                     f"| {s['budget_accuracy']:.1%} |")
        print(lines[-1], flush=True)
    return save_table(lines, args.out, "twins_probe.md")


if __name__ == "__main__":
    main()
