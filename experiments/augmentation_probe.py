"""Does training-time augmentation help on curves unlike the ID ones? Judged on ID data only.

The RL OOD curves (DQN TD losses) rise for a while before they fall; every
ID family decreases almost monotonically. `PredictorConfig.augment_prob`
trains on ID curves with a smooth random multiplicative wobble. To choose it
without looking at any OOD set, this script scores FM predictors and WLS on
ID *validation* curves twice: as they are, and with a held-out perturbation
of a different shape from the training wobble — a sudden jump of the
per-batch loss by a factor F ∈ [1.5, 4] at a random batch, decaying back
with a time constant of 10–60 batches (a learning-rate spike or a data
shift). A candidate is kept if it improves the shocked set without costing
the clean one more than a few percent; only then is it scored once on the
OOD sets with `mara eval-predictor`.

    python experiments/augmentation_probe.py --fm base=artifacts/predictor/default/predictor \\
        --fm aug=/tmp/aug/predictor --out reports/default/probe
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from mara_fm.bank import CurveSet, load_bank, select
from mara_fm.eval_predictor import QueryConfig, evaluate, make_queries, reference_curves
from mara_fm.fm_predictor import FMPredictor, torch_threads
from mara_fm.predictors import WLSPredictor


def shocked(curves: CurveSet, rng: np.random.Generator, factor: tuple[float, float] = (1.5, 4.0),
            decay: tuple[float, float] = (10.0, 60.0), start: tuple[int, int] = (10, 200)) -> CurveSet:
    """Every curve with one decaying jump of its per-batch loss (see the module docstring)."""
    n, cap = curves.losses.shape
    at = rng.integers(start[0], start[1] + 1, size=n)
    jump = rng.uniform(*factor, size=n) - 1.0
    tau = rng.uniform(*decay, size=n)
    since = np.arange(cap)[None, :] - at[:, None]
    bump = np.where(since >= 0, jump[:, None] * np.exp(-np.maximum(since, 0) / tau[:, None]), 0.0)
    return dataclasses.replace(curves, losses=curves.losses * (1.0 + bump))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bank", type=Path, default=Path("data/banks/default.parquet"))
    parser.add_argument("--fm", action="append", required=True, help="NAME=DIR of an exported FM predictor")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="folder for augmentation_probe.md")
    args = parser.parse_args()
    frame = load_bank(args.bank)
    train, val = select(frame, "id", "train"), select(frame, "id", "val")
    ref = reference_curves(val, train)
    sets = {name: (c, make_queries(c, ref, QueryConfig()))
            for name, c in (("id_val", val), ("id_val_shocked", shocked(val, np.random.default_rng(args.seed))))}
    pairs = [item.partition("=") for item in args.fm]
    if any(not name or not path for name, _, path in pairs):
        parser.error("--fm takes NAME=DIR")
    predictors = {name: FMPredictor.load(path) for name, _, path in pairs}
    with torch_threads(1):
        records = evaluate({**predictors, "wls": WLSPredictor()}, sets, timing=False)
    lines = ["| set | predictor | queries | capped MAE | vs WLS | budget acc. |", "|---|---|---|---|---|---|"]
    for r in records:
        change = f"{-100 * r['mae_reduction_vs_wls']:+.1f}%" if "mae_reduction_vs_wls" in r else "—"
        lines.append(f"| {r['task_set']} | {r['predictor']} | {r['n_queries']} | {r['capped_mae']:.2f} | "
                     f"{change} | {100 * r['budget_accuracy']:.1f}% |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "augmentation_probe.md").write_text(
            f"# Augmentation probe (ID val, clean and shocked)\n\n{table}\n")


if __name__ == "__main__":
    main()
