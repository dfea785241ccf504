"""Probe: does FM's error on a task persist, so that a task's own past errors could correct it?

FM's median is off by a per-task factor (docs/experiments.md, "A task's own past errors"). If that factor
persisted along a run, a predictor could measure it on the part of the curve it has
already seen: forecast from an earlier prefix, compare with the present, and correct the
forecast from the present by the same amount. For each of the evaluation protocol's
queries on ID val (prefix n, threshold ε), the probe measures three log errors:

- backcast: the observed log L(n) minus FM's median log L̂(n) forecast from the prefix
  n₀ = max(4, ⌊(1 − back)·n⌋) (the error a predictor could see now);
- ahead: the true log L(n + k), k = min(ahead, cap − n), minus FM's median forecast of it
  from the prefix n;
- crossing: log(1 + true remaining batches to ε) minus log(1 + FM's median estimate).

and prints, per query rank (how far along the run the prefix is), the correlation of the
backcast error with the other two. A correlation near 0 says the error does not persist
and there is nothing to correct from a task's own past. ID val only. Run from the
project root:

    python -m experiments.probes.persistence_probe

Writes experiments/probes/results/persistence_probe.md, or into --out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from experiments.probes.common import probe_parser, save_table
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_fm.bank import load_bank, select
from mara_fm.eval_predictor import make_queries, reference_curves
from mara_fm.predictors import WARMUP_POINTS, FMPredictor
from mara_fm.predictors.base import HistoryBatch


def median_log_level(fm: FMPredictor, hist: HistoryBatch, horizon: np.ndarray, length: np.ndarray) -> np.ndarray:
    """(E,) FM's median over its M paths of log L̂ after `length` batches (within the horizon),
    interpolated between the equally spaced boundaries of the forecast from `hist`."""
    s, paths = fm.forecast(hist, horizon)
    pos = (length * hist.batch_size - s[:, 0]) / (s[:, 1] - s[:, 0])
    j = np.clip(np.floor(pos).astype(np.int64), 0, s.shape[1] - 2)
    w = (pos - j)[:, None]
    rows = np.arange(len(hist))
    log_paths = np.log(np.maximum(paths, 1e-12))
    level = (1 - w) * log_paths[rows, :, j] + w * log_paths[rows, :, j + 1]
    return np.median(level, axis=1)


def correlation(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(x, y)[0, 1]) if len(x) > 2 and x.std() > 0 and y.std() > 0 else float("nan")


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True)
    parser.add_argument("--back", type=float, default=0.5,
                        help="the backcast starts from the first (1 − back) share of each query's prefix")
    parser.add_argument("--ahead", type=int, default=60, help="batches ahead of the prefix for the ahead error")
    args = parser.parse_args(argv)
    if not 0 < args.back < 1 or args.ahead < 1:
        parser.error("--back lies in (0, 1) and --ahead is at least 1")
    profile = Profile.load(args.profile)
    fm = FMPredictor.load(args.fm or profile.paths.predictor)
    frame = load_bank(args.bank or profile.paths.bank)
    val = select(frame, "id", "val")
    q = make_queries(val, reference_curves(val, select(frame, "id", "train")))
    rows, n = q.curve, q.hist.lengths
    n0 = np.maximum(WARMUP_POINTS, np.floor((1 - args.back) * n).astype(np.int64))
    k = np.minimum(args.ahead, val.cap - n)
    keep = (n0 < n) & (k > 0)
    with torch_threads(1):
        earlier = HistoryBatch.from_curves(val.avg[rows], n0, val.batch_size[rows], val.lr[rows])
        backcast = np.log(val.avg[rows, n - 1]) - median_log_level(fm, earlier, (val.cap - n0).astype(float), n)
        ahead = np.log(val.avg[rows, n + k - 1]) - median_log_level(fm, q.hist, q.horizon, n + k)
        estimate = fm.remaining_batches(q.hist, q.eps, q.horizon)
    crossing = np.log1p(q.truth) - np.log1p(estimate)

    lines = [f"# Does FM's error on a task persist? (ID val, backcast from {1 - args.back:.0%} of the prefix, "
             f"{args.ahead} batches ahead)", "",
             "| query rank | queries | sd backcast | sd ahead | corr(backcast, ahead) | corr(backcast, crossing) |",
             "|---|---|---|---|---|---|"]
    for rank in [*range(q.n_ranks), None]:
        sel = keep & (q.rank == rank) if rank is not None else keep
        if sel.sum() < 3:
            continue
        lines.append(f"| {'all' if rank is None else rank} | {int(sel.sum())} | {backcast[sel].std():.3f} | "
                     f"{ahead[sel].std():.3f} | {correlation(backcast[sel], ahead[sel]):+.3f} | "
                     f"{correlation(backcast[sel], crossing[sel]):+.3f} |")
    return save_table(lines, args.out, "persistence_probe.md")


if __name__ == "__main__":
    main()
