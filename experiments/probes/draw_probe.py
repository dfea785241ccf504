"""Probe: how much do the told search's labels depend on the candidates it draws?

The told search (the worlds probe's rollout planner in the true world, no later
arrivals, drops for one decision) judges a few swaps and drops drawn at random
at each decision, so whether and where it leaves the teacher is partly the
draw's. Here the teacher (told the exact demand, deciding at events) plays
`--episodes` ID training episodes, and every state it reaches is labelled by the
search under each of `--seeds` (3 swaps and 3 drops drawn) and by the search
over every candidate (`all`, a function of the state). For each ordered pair of
labellers the table gives, where the first leaves the teacher, how often the
second leaves it too and how often to the same joint action.

    python -m experiments.probes.draw_probe --profile cluster --episodes 24 --seeds 1,2,3

Writes experiments/probes/results/draw_probe.md, or into --out.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from experiments.probes.common import probe_parser, save_table, table_name, told_training_env
from experiments.probes.rollout_labels import blind_teacher
from experiments.probes.worlds_probe import TEACHER, told_search
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_rl.imitation import demonstrations


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__)
    parser.add_argument("--episodes", type=int, default=24, help="training episodes the teacher plays")
    parser.add_argument("--seeds", default="1,2,3", help="the drawn searches' seeds, comma-separated")
    parser.add_argument("--hold", type=int, default=10, help="decision interval")
    args = parser.parse_args(argv)
    with torch_threads(1):
        profile = Profile.load(args.profile)
        cfg = told_training_env(profile, args.bank, args.hold)
        seed = 800_000  # the episodes, the same for every labeller
        teacher = demonstrations(cfg, TEACHER, args.episodes, seed).actions.numpy()
        labels = {}
        for name, count, draw in [*((f"seed {s}", 3, s) for s in comma_list(args.seeds, "--seeds", int)), ("all", None, 0)]:
            labels[name] = demonstrations(cfg, told_search(count, draw), args.episodes, seed,
                                          driver=blind_teacher(TEACHER, {})).actions.numpy()
        leaves = {name: ~np.all(a == teacher, axis=1) for name, a in labels.items()}
        lines = [f"# How much the told search's labels are its draw's ({profile.name})", "",
                 f"{len(teacher)} states of {args.episodes} training episodes played by the told teacher (decisions at "
                 f"events, H = {args.hold}). " + ", ".join(f"{n} leaves the teacher at {100 * v.mean():.1f}%"
                                                           for n, v in leaves.items()) + ".", "",
                 "| first | second | first leaves the teacher | second leaves it too | to the same joint action |",
                 "|---|---|---|---|---|"]
        for a, b in itertools.permutations(labels, 2):
            rows = leaves[a]
            too, same = ((leaves[b][rows].mean(), np.all(labels[a][rows] == labels[b][rows], axis=1).mean())
                         if rows.any() else (float("nan"), float("nan")))
            lines.append(f"| {a} | {b} | {rows.sum()} | {100 * too:.1f}% | {100 * same:.1f}% |")
        print("\n".join(lines), flush=True)
        return save_table(lines, args.out, table_name("draw_probe", profile))


if __name__ == "__main__":
    main()
