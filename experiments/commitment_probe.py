"""Probe: how long must a deviation from LARA last before it changes an episode's successes?

PPO explores by sampling each step's joint action around the policy. Started
from a copy of LARA-FM, it can only learn from deviations whose effect shows
in the return. This replays frozen ID validation episodes under LARA (on the
FM forecasts by default) and, in paired copies, deviates once: at step t0
the earliest-deadline task that LARA leaves unserved takes the place of
LARA's last pick, for k consecutive steps (while it is present and LARA
still leaves it out); LARA decides everything else. The simulator is
deterministic given the episode, so each copy's difference in successes from
the undisturbed episode is exact. Copies where LARA serves every task at t0
(no contention) cannot deviate and are left out of the figures.

    python experiments/commitment_probe.py --profile default --roots 5
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from mara_env.allocators import LARA
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import replay_in_lockstep
from mara_fm.profile import section_config
from mara_rl.evaluate import pooled_episodes
from mara_rl.pipeline import Paths


@dataclasses.dataclass
class Deviation:
    episode: int
    start: int | None = None  # None: the undisturbed episode
    length: int = 0
    task: int = -1  # the task served instead, chosen at `start`; -1 = none was left out


def deviate(lara: LARA, env: MultiNodeEnv, dev: Deviation) -> np.ndarray:
    """LARA's joint action, with `dev.task` in place of its last pick inside the deviation."""
    action = lara.act(env.scheduler_view())
    if dev.start is None or not dev.start <= env.t < dev.start + dev.length:
        return action
    if env.t == dev.start:
        view = env.scheduler_view()
        served = set((action[action > 0] - 1).tolist())
        left = sorted((s for s in np.flatnonzero(view.present) if s not in served),
                      key=lambda s: (view.deadline[s], s))
        dev.task = int(env.slot_task[left[0]]) if left else -1
    slot = np.flatnonzero(env.slot_task == dev.task) if dev.task >= 0 else []
    if len(slot) and slot[0] + 1 not in action:
        action = action.copy()
        action[-1] = slot[0] + 1
    return action


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--predictor", default=None,
                        help="predictor spec inside the env (default: the profile's FM predictor)")
    parser.add_argument("--roots", type=int, default=5)
    parser.add_argument("--episodes-per-root", type=int, default=8)
    parser.add_argument("--starts", default="50,100,150,200,250,300,350,400,450")
    parser.add_argument("--lengths", default="1,5,20,60")
    parser.add_argument("--load", type=float, default=0.04)
    args = parser.parse_args()

    paths = Paths(args.profile)
    bank, fm = paths.bank, paths.fm
    cfg = section_config(EnvConfig, args.profile, "env", bank=str(bank), split="val", arrival_prob=args.load,
                         predictor=args.predictor or f"fm:{fm.resolve()}")
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    lengths = [int(k) for k in args.lengths.split(",")]
    deviations = [Deviation(i) for i in range(len(episodes))]
    deviations += [Deviation(i, int(t0), k) for i in range(len(episodes))
                   for t0 in args.starts.split(",") for k in lengths]

    lara, index = LARA(), {}

    def decide(obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        if not index:  # the first call sees every env, in the order of `deviations`
            index.update({id(env): dev for env, dev in zip(envs, deviations, strict=True)})
        return np.stack([deviate(lara, env, index[id(env)]) for env in envs])

    finals = replay_in_lockstep(cfg, [episodes[d.episode] for d in deviations], decide)
    successes = [f["episode_successes"] for f in finals]
    base = {d.episode: s for d, s in zip(deviations, successes, strict=True) if d.start is None}
    print(f"{len(episodes)} ID val episodes, predictor {cfg.predictor}")
    for k in lengths:
        diff = np.array([s - base[d.episode] for d, s in zip(deviations, successes, strict=True)
                         if d.length == k and d.task >= 0])
        tried = sum(d.length == k for d in deviations)
        print(f"k = {k:3d} steps: {len(diff)}/{tried} deviations, outcome changed in {np.mean(diff != 0):.0%} "
              f"(gains {np.sum(diff > 0)}, losses {np.sum(diff < 0)}), mean change {diff.mean():+.3f} successes")


if __name__ == "__main__":
    main()
