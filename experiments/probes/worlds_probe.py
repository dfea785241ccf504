"""Probe: does planning over FM's sampled worlds beat the teacher, which reads one sample?

At each step, each of W worlds draws, for every active task past its judgement
point, one of FM's M sampled crossings (independently per task); the exact
planner (`llf`: exact N-node feasibility, least-laxity service) plans each
world as if its demands were true, and the tasks are ranked by how many
worlds serve (or keep) them now. Validation episodes only.

    python -m experiments.probes.worlds_probe --worlds 16 --loads 0.04,0.07

Writes experiments/probes/results/worlds_probe.md, or into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from experiments.probes.common import add_common_flags, add_replay_flags, save_table, success
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.allocators import can_meet_deadlines, joint_action
from mara_env.env import EnvConfig
from mara_env.vector import BatchDecide, replay_in_lockstep
from mara_fm.bank import CurveSet
from mara_fm.predictors import FMPredictor
from mara_fm.predictors.base import HistoryBatch
from mara_rl.evaluate import pooled_episodes


class SampleKeepingFM(FMPredictor):
    """FM that also remembers each answered prefix's M sorted crossings (inf: never)."""

    def __init__(self, fm: FMPredictor) -> None:
        super().__init__(fm.model, fm.cfg, fm.stats)
        self.samples: dict[tuple[int, int], np.ndarray] = {}

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        out = super().replay_remaining(source, rows, lengths, eps, horizon, optimistic)
        hist = HistoryBatch.from_curves(source.avg[rows], lengths, source.batch_size[rows], source.lr[rows])
        crossings = self.sorted_crossings(hist, eps, horizon)
        crossings = np.where(crossings >= horizon[:, None], np.inf, crossings)
        crossings[hist.current <= eps] = 0.0
        for r, n, c in zip(rows.tolist(), lengths.tolist(), crossings, strict=True):
            self.samples[(r, n)] = c
        return out


def plan_world(slots: list[int], demand: np.ndarray, time_left: np.ndarray, n_nodes: int) -> list[int]:
    """llf on one world: the kept set (EDF walk, exact test), least laxity first."""
    kept: list[int] = []
    for s in sorted(slots, key=lambda s: (time_left[s], s)):
        if demand[s] > time_left[s]:
            continue
        kept.append(s)
        if not can_meet_deadlines(demand[kept], time_left[kept], n_nodes):
            kept.remove(max(kept, key=lambda k: demand[k]))
    return sorted(kept, key=lambda s: (time_left[s] - demand[s], time_left[s], s))


def worlds_decide(fm: SampleKeepingFM, worlds: int, vote: str, seed: int = 0) -> BatchDecide:
    """Rank tasks by the worlds that serve them now (`vote` = "served") or keep them ("kept");
    tasks before their judgement point first, EDF, as the teacher does."""
    def decide(obs, envs):
        actions = []
        for env in envs:
            view = env.scheduler_view()
            slots = np.flatnonzero(view.present)
            edf = slots[np.lexsort((view.arrival[slots], view.deadline[slots]))]
            judged = view.probe_points or 4
            warm = [s for s in edf if view.observed[s] < judged]
            rest = [s for s in edf if view.observed[s] >= judged]
            time_left = (view.deadline - view.t).astype(np.float64)
            score = np.zeros(len(view.present))
            if rest:
                tasks = env.slot_task[rest]
                samples = np.stack([fm.samples[(int(env.task_rows[k]), int(env.n_obs[k]))] for k in tasks])
                rng = np.random.default_rng([seed, env.t, int(tasks.sum())])
                pick = rng.integers(0, samples.shape[1], (worlds, len(rest)))
                free = view.n_nodes - len(warm)
                for w in range(worlds):
                    demand = np.zeros(len(view.present))
                    demand[rest] = np.maximum(samples[np.arange(len(rest)), pick[w]], 1.0)
                    order = plan_world(rest, demand, time_left, view.n_nodes)
                    chosen = order[:max(free, 0)] if vote == "served" else order
                    score[chosen] += 1
            ranked = sorted(rest, key=lambda s: (-score[s], time_left[s], s))
            actions.append(joint_action(warm + ranked, view.n_nodes))
        return np.stack(actions)

    return decide


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_flags(parser)
    add_replay_flags(parser)
    parser.add_argument("--worlds", type=int, default=16)
    parser.add_argument("--loads", default="0.04")
    args = parser.parse_args(argv)
    profile = Profile.load(args.profile)
    fm = SampleKeepingFM(FMPredictor.load(args.fm or profile.paths.predictor))
    lines = ["| load | teacher | llf_fm | worlds served | worlds kept |", "|---|---|---|---|---|"]
    with torch_threads(1):
        for load in (float(x) for x in args.loads.split(",")):
            cfg = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), split="val",
                                  task_set="id", arrival_prob=load)
            episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
            row = [success(cfg, episodes, fm), success(cfg, episodes, fm, "llf")]
            for vote in ("served", "kept"):
                outs = replay_in_lockstep(dataclasses.replace(cfg, predictor=fm), episodes,
                                          worlds_decide(fm, args.worlds, vote))
                row.append(100 * float(np.mean([o["success_rate"] for o in outs])))
            lines.append(f"| {load} | " + " | ".join(f"{r:.2f}" for r in row) + " |")
            print(lines[-1], flush=True)
    return save_table(lines, args.out, "worlds_probe.md")


if __name__ == "__main__":
    main()
