"""Probe: do the rules lose or gain when they decide only at events?

Replays the scheduler trainer's validation episodes (ID val, the episodes that
pick a run's exported policy, `[scheduler] eval_episodes` from `eval_seed`)
under the teacher (`lara_optimistic`) and `llf` on FM, deciding every step and
with each decision held until an event for at most H steps
(`EnvConfig.decision_interval`, docs/design.md §3). It chose the held rules of
the evaluation (`*_held` in `mara_rl/methods.py`).

Validation curves only. Run from the project root:

    python -m experiments.probes.hold_probe --intervals 10,20
    python -m experiments.probes.hold_probe --profile cluster

Writes experiments/probes/results/hold_probe[_<profile>].md, or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from experiments.probes.common import (
    probe_parser,
    save_table,
    success,
    table_name,
    trainer_val_episodes,
)
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads

RULES = ("lara_optimistic", "llf")


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True)
    parser.add_argument("--intervals", default="10,20", help="decision intervals H, comma-separated")
    parser.add_argument("--episodes", type=int, help="validation episodes (default: the profile's eval_episodes)")
    args = parser.parse_args(argv)
    with torch_threads(1):
        profile = Profile.load(args.profile)
        env, episodes = trainer_val_episodes(profile, args.bank or profile.paths.bank, args.fm, args.episodes)
        intervals = [None, *comma_list(args.intervals, "--intervals", int)]
        lines = [f"# Rules deciding at events ({len(episodes)} ID val episodes of the trainer, profile {profile.name})",
                 "", "Success %; `every step` is the rule as evaluated, `H` its decisions held up to H steps.", "",
                 "| rule | every step | " + " | ".join(f"H = {h}" for h in intervals[1:]) + " |",
                 "|---|" + "---|" * len(intervals)]
        for rule in RULES:
            rates = [success(dataclasses.replace(env, decision_interval=h), episodes, env.predictor, rule)
                     for h in intervals]
            lines.append(f"| {rule} | " + " | ".join(f"{r:.2f}" for r in rates) + " |")
            print(lines[-1], flush=True)
        return save_table(lines, args.out, table_name("hold_probe", profile))


if __name__ == "__main__":
    main()
