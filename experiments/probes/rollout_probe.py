"""Probe: does the teacher leave better actions on the table, even judged with hindsight?

A learned scheduler beats its teacher only where some other action does better.
This plays the teacher (`lara_optimistic` on FM) on frozen ID validation
episodes with decisions at events (`--interval`), and at a share of the states
where it leaves a task waiting, copies the env (`MultiNodeEnv.clone`) and
plays paired rollouts (`mara_rl.rollout_labels`) of the rest of the episode: the teacher's own action
against up to `--alternatives` candidates of two kinds,

- *swap*: the teacher's action with one served task replaced by a waiting one,
  held until the next decision, the teacher deciding afterwards;
- *drop*: the teacher giving up one task it serves now, for the rest of the
  episode (as if it had judged it hopeless).

Copies share every arrival and every curve, so a candidate's difference in
successes is its own, exactly; and the rollouts read the true curves, so the
figures bound what any policy could gain by such deviations at those states.
If a better candidate is rare, labels made of them (rollout-based imitation,
AggreVaTe-style) are too sparse to teach a policy to beat the teacher.

Validation curves only (ID val). Run from the project root:

    python -m experiments.probes.rollout_probe --roots 5

Writes experiments/probes/results/rollout_probe.md, or into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from experiments.probes.common import add_common_flags, add_replay_flags, save_table
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import replay_in_lockstep
from mara_rl.evaluate import pooled_episodes
from mara_rl.rollout_labels import KINDS, blind_teacher, candidates, judge

TEACHER = "lara_optimistic"


def measure(cfg: EnvConfig, episodes: list, kind: str, share: float, count: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    plain = blind_teacher(TEACHER, {})
    gains, worse = [], []

    def decide(obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        actions = plain(obs, envs)
        for env, action in zip(envs, actions, strict=True):
            contended = (env.slot_task >= 0).sum() > (action > 0).sum()
            if not contended or rng.random() >= share:
                continue
            options = [(kind, x) for x in candidates(kind, action, env, count, rng)]
            ends, _ = judge(TEACHER, env, action, options)
            gains.append(max(ends) - ends[0])
            worse.append(np.mean([e < ends[0] for e in ends[1:]]))
        return actions

    replay_in_lockstep(cfg, episodes, decide)
    gains = np.array(gains)
    return {"states": len(gains), "improved": float(np.mean(gains > 0)), "gain": float(gains.mean()),
            "worse": float(np.mean(worse))}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_flags(parser)
    add_replay_flags(parser)
    parser.add_argument("--interval", type=int, default=10, help="decision_interval of the replayed env")
    parser.add_argument("--share", type=float, default=0.25, help="share of contended states judged")
    parser.add_argument("--alternatives", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch_threads(1)
    profile = Profile.load(args.profile)
    fm = (args.fm or profile.paths.predictor).resolve()
    cfg = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), split="val", task_set="id",
                          predictor=f"fm:{fm}", decision_interval=args.interval)
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    lines = [f"# Rollout probe ({len(episodes)} ID val episodes, decisions at events, interval {args.interval})",
             "",
             f"At {args.share:.0%} of the contended states the teacher (`lara_optimistic` on FM) reaches, its "
             f"action against up to {args.alternatives} alternatives, each judged by a paired rollout to the "
             "episode's end (the teacher deciding after it).",
             "",
             "| candidates | states judged | a candidate beats the teacher | mean gain (successes) "
             "| candidates worse than the teacher |",
             "|---|---|---|---|---|"]
    for kind in KINDS:
        row = measure(cfg, episodes, kind, args.share, args.alternatives, args.seed)
        print(kind, row, flush=True)
        lines.append(f"| {kind} | {row['states']} | {100 * row['improved']:.1f}% | {row['gain']:.3f} "
                     f"| {100 * row['worse']:.1f}% |")
    return save_table(lines, args.out, "rollout_probe.md")


if __name__ == "__main__":
    main()
