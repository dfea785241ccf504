"""Probe: LARA on the FM forecasts with another statistic of the sampled crossings than the median.

The FM predictor draws M future loss paths per task and reports the median
of their threshold crossings (DESIGN §5.1); LARA-FM and the MAT see that one
number. Here LARA runs on the frozen ID validation episodes with the env's
predictor replaced by the same model reporting another order statistic (or
the mean) of the M crossings, to measure how much the spread of the samples
could tell a scheduler. (The default profile acts on this finding: its env
shows the 2nd smallest crossing as a 5th slot feature, `optimistic_quantile`,
and MARA's warm start imitates LARA planning on it.)

    python experiments/forecast_quantile_probe.py --profile default --stats median,0,1,2,mean,5
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from mara_env.env import EnvConfig
from mara_env.vector import replay_in_lockstep
from mara_fm.fm_predictor import FMPredictor
from mara_fm.predictors import HistoryBatch
from mara_fm.profile import section_config
from mara_rl.evaluate import classic, pooled_episodes
from mara_rl.pipeline import Paths


class CrossingStatisticFM(FMPredictor):
    """The FM predictor reporting the `order`-th smallest of its M crossings, or their mean."""

    def __init__(self, base: FMPredictor, statistic: str) -> None:
        super().__init__(base.model, base.cfg, base.stats)
        self.statistic = statistic

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        if self.statistic == "median":
            return super()._predict(hist, eps, horizon)
        ordered = self.sorted_crossings(hist, eps, horizon)
        return ordered.mean(1) if self.statistic == "mean" else ordered[:, int(self.statistic)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--stats", default="median,0,1,2,mean,5",
                        help="median | mean | k (the k-th smallest crossing, 0-based), comma-separated")
    parser.add_argument("--roots", type=int, default=5)
    parser.add_argument("--episodes-per-root", type=int, default=8)
    parser.add_argument("--load", type=float, default=0.04)
    args = parser.parse_args()

    paths = Paths(args.profile)
    bank, fm = paths.bank, FMPredictor.load(paths.fm)
    cfg = section_config(EnvConfig, args.profile, "env", bank=str(bank), split="val", arrival_prob=args.load)
    # The point estimate alone: with the optimistic band on, the env would read the
    # median from `_predict_band`, bypassing the statistic under test.
    cfg = dataclasses.replace(cfg, optimistic_quantile=None)
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    print(f"LARA on {len(episodes)} ID val episodes (M = {fm.cfg.samples} FM samples)")
    for statistic in args.stats.split(","):
        predictor = CrossingStatisticFM(fm, statistic)
        finals = replay_in_lockstep(dataclasses.replace(cfg, predictor=predictor), episodes, classic("lara")())
        print(f"{statistic:>6}: {100 * np.mean([f['success_rate'] for f in finals]):.2f}% success", flush=True)


if __name__ == "__main__":
    main()
