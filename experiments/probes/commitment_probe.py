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

Validation curves only (ID val). Run from the project root:

    python -m experiments.probes.commitment_probe --roots 5

Writes experiments/probes/results/commitment_probe.md, or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from experiments.probes.common import probe_parser, save_table
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.allocators import LARA
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import replay_in_lockstep
from mara_rl.evaluate import pooled_episodes


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


def replay(cfg: EnvConfig, episodes: list, deviations: list[Deviation]) -> list[int]:
    """Each deviation's episode under LARA with that deviation: its successes."""
    lara, index = LARA(), {}

    def decide(obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        if not index:  # the first call sees every env, in the order of `deviations`
            index.update({id(env): dev for env, dev in zip(envs, deviations, strict=True)})
        return np.stack([deviate(lara, env, index[id(env)]) for env in envs])

    finals = replay_in_lockstep(cfg, [episodes[d.episode] for d in deviations], decide)
    return [f["episode_successes"] for f in finals]


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, roots=True)
    parser.add_argument("--predictor", default=None,
                        help="predictor spec inside the env (default: the profile's FM predictor)")
    parser.add_argument("--starts", default="50,100,150,200,250,300,350,400,450",
                        help="steps t0 at which a deviation starts, comma-separated")
    parser.add_argument("--lengths", default="1,5,20,60", help="deviation lengths k, comma-separated")
    parser.add_argument("--load", type=float, help="arrival probability (default: the profile's)")
    args = parser.parse_args(argv)

    profile = Profile.load(args.profile)
    cfg = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), split="val",
                          task_set="id", arrival_prob=args.load,
                          predictor=args.predictor or f"fm:{profile.paths.predictor.resolve()}")
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    starts = comma_list(args.starts, "--starts", int)
    lengths = comma_list(args.lengths, "--lengths", int)
    deviations = [Deviation(i) for i in range(len(episodes))]
    deviations += [Deviation(i, t0, k) for i in range(len(episodes)) for t0 in starts for k in lengths]
    with torch_threads(1):
        successes = replay(cfg, episodes, deviations)

    base = {d.episode: s for d, s in zip(deviations, successes, strict=True) if d.start is None}
    lines = [f"LARA on {len(episodes)} ID validation episodes at p = {cfg.arrival_prob}, predictor "
             f"`{cfg.predictor}`; one deviation per copy, starting at t0 ∈ {{{', '.join(map(str, starts))}}}.",
             "", "| k (steps) | deviations (with contention / tried) | outcome changed (%) | gains | losses "
             "| mean change (successes) |", "|---|---|---|---|---|---|"]
    for k in lengths:
        diff = np.array([s - base[d.episode] for d, s in zip(deviations, successes, strict=True)
                         if d.length == k and d.task >= 0])
        tried = sum(d.length == k for d in deviations)
        changed, mean = ((f"{100 * np.mean(diff != 0):.1f}", f"{diff.mean():+.3f}") if len(diff) else ("–", "–"))
        lines.append(f"| {k} | {len(diff)} / {tried} | {changed} | {np.sum(diff > 0)} | {np.sum(diff < 0)} "
                     f"| {mean} |")
        print(lines[-1], flush=True)
    return save_table(lines, args.out, "commitment_probe.md")


if __name__ == "__main__":
    main()
