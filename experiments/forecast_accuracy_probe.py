"""Probe: how much better forecasts would lift MARA's teacher on the ID validation episodes.

Scores LARA (on the median) and `lara_optimistic` (on the optimistic order
statistic) with the env's FM predictor replaced by a variant: another
exported network, other sampling settings (M samples, Euler steps), or
several exported networks pooled into one predictor whose M·k sampled
crossings are ranked together. Validation curves of the ID set only; the
OOD sets have no validation split (README, stage one).

    python experiments/forecast_accuracy_probe.py --fm artifacts/predictor/default/predictor
    python experiments/forecast_accuracy_probe.py --fm A/predictor,B/predictor,C/predictor
    python experiments/forecast_accuracy_probe.py --fm artifacts/predictor/default/predictor --samples 16 --steps 4
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


class PooledFM(FMPredictor):
    """Several FM predictors answering as one: their sampled crossings, ranked together."""

    def __init__(self, members: list[FMPredictor]) -> None:
        first = members[0]
        super().__init__(first.model, first.cfg, first.stats)
        self.members = members

    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        crossings = [m.sorted_crossings(hist, eps, horizon) for m in self.members]
        return np.sort(np.concatenate(crossings, axis=1), axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--fm", required=True, help="exported FM predictor folder(s), comma-separated to pool")
    parser.add_argument("--samples", type=int, help="override M (every pooled member)")
    parser.add_argument("--steps", type=int, help="override the Euler step count (every pooled member)")
    parser.add_argument("--quantile", type=float, help="override [env] optimistic_quantile")
    parser.add_argument("--roots", type=int, default=5)
    parser.add_argument("--episodes-per-root", type=int, default=8)
    args = parser.parse_args()

    members = [FMPredictor.load(path) for path in args.fm.split(",")]
    for m in members:
        m.set_sampling(args.samples or m.cfg.samples, args.steps or m.cfg.euler_steps)
    predictor = members[0] if len(members) == 1 else PooledFM(members)
    bank = Paths(args.profile).bank
    cfg = dataclasses.replace(section_config(EnvConfig, args.profile, "env", bank=str(bank), split="val"),
                              predictor=predictor)
    quantile = cfg.optimistic_quantile if args.quantile is None else args.quantile
    if quantile is None:
        parser.error(f"profile {args.profile!r} sets no [env] optimistic_quantile; pass --quantile")
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    print(f"{len(episodes)} ID val episodes; {len(members)} predictor(s), "
          f"M = {members[0].cfg.samples}, steps = {members[0].cfg.euler_steps}, quantile = {quantile}")
    for teacher in ("lara", "lara_optimistic"):
        run_cfg = dataclasses.replace(cfg, optimistic_quantile=quantile if teacher == "lara_optimistic" else None)
        finals = replay_in_lockstep(run_cfg, episodes, classic(teacher)())
        print(f"{teacher:>16}: {100 * np.mean([f['success_rate'] for f in finals]):.2f}% success", flush=True)


if __name__ == "__main__":
    main()
