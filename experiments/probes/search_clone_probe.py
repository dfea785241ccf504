"""Probe: can the MAT copy the told search on the search's own states?

The rollout probe's labels are single deviations judged with hindsight, on the
MAT's states; fitted to them the MAT memorises them and carries none to new
states. Here the teacher is the search itself: the worlds probe's rollout
planner in the true world (`rollout_decide` with no forecast, no later
arrivals; decisions at events), which beats the teacher by about 4 points on
the cluster when every demand is exact. It plays `--episodes` ID training
episodes and `--held-out` others; the MAT of `--policy` (a hinted MAT in the
same env: `--rule-hint`, so a row where the search leaves the teacher is one
whose label differs from the hint) is fitted to the first set's rows by
behaviour cloning, and after each stage reports, on both sets, how often its
greedy joint action is the search's where the search deviates and where it
does not, and its validation as the trainer runs it (greedy, 128 ID val
episodes). Rows the MAT cannot take (a drop leaves a node idle beside a
waiting task, which its work-conserving mask refuses) are left out.

With `--no-persist-drops` a task the search drops is dropped for that
decision only, so no label depends on an earlier one; with `--alternatives
all` as well the search judges every swap and drop instead of a random few,
and every label is a function of the state the env shows. (With drawn
candidates a label is the draw's too: where one draw leaves the hint, another
leaves it to the same joint action about a quarter of the time, and a clone
fitted by likelihood keeps to the hint there.) With
`--dagger-rounds R` the fit continues DAgger-style: the MAT plays
`--dagger-episodes` fresh training episodes, the search labels every state it
reaches, those rows join the fitted ones and the MAT is refitted (the last
stage's epochs), R times. (A search whose drops persist would carry along the
MAT's trajectory a drop set the MAT never sees; the rounds need
`--no-persist-drops`.)

With `--sizes S1,S2,...` it draws a learning curve instead: a fresh copy of
the MAT is fitted (the stages' epochs in one go) on the rows of the first Sk
training episodes, for each k, and read on the same held-out rows: whether
more of the search's labels would teach the MAT its departures. `--weight W`
repeats every row where the search leaves the hint W times in each fit.
`--export DIR` writes the MAT of the stage that validates best (and
`stage.txt`, its name and figure).

    python -m experiments.probes.search_clone_probe --profile cluster \\
        --policy artifacts/scheduler/RUN/warm_start_policy

Writes experiments/probes/results/search_clone_probe.md, or into --out.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import numpy as np
import torch

from experiments.probes.common import add_alternatives_flag, probe_parser, save_table
from experiments.probes.rollout_probe import policy_training_env, takes
from experiments.probes.worlds_probe import told_search
from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.vector import BatchDecide
from mara_rl.imitation import Demonstrations, demonstrations, imitate, takeable
from mara_rl.mat_module import MATModule
from mara_rl.policy import act, export_policy
from mara_rl.scheduler_config import scheduler_config
from mara_rl.train_scheduler import evaluate_policy


def deviating(demos: Demonstrations) -> np.ndarray:
    """Rows where the search's joint action is not the hint's."""
    return ~np.all(demos.actions.numpy() == demos.obs["rule_action"].numpy(), axis=1)


def taken(module: MATModule, demos: Demonstrations) -> tuple[float, float, float]:
    """(share of rows where the search leaves the hint, share of those where the MAT's greedy joint
    action is the search's, the same share on the other rows); NaN for a share of no rows."""
    deviates = deviating(demos)
    same = takes(module, {k: v.numpy() for k, v in demos.obs.items()}, demos.actions.numpy())
    def share(rows: np.ndarray) -> float:
        return float(same[rows].mean()) if rows.any() else float("nan")

    return float(deviates.mean()), share(deviates), share(~deviates)


def weighted(demos: Demonstrations, weight: int) -> Demonstrations:
    """`demos` with every row where the search leaves the hint repeated `weight` times."""
    extra = demos.rows(torch.as_tensor(np.tile(np.flatnonzero(deviating(demos)), weight - 1)))
    return demos + extra if len(extra) else demos


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__)
    parser.add_argument("--policy", type=Path, required=True, help="a hinted MAT (e.g. a run's warm_start_policy)")
    parser.add_argument("--episodes", type=int, default=184, help="training episodes the search plays for the fit")
    parser.add_argument("--held-out", type=int, default=24, help="other training episodes, never fitted")
    add_alternatives_flag(parser)
    parser.add_argument("--epochs", default="20,20", help="epochs of each fitting stage, comma-separated")
    parser.add_argument("--persist-drops", action=argparse.BooleanOptionalAction, default=True,
                        help="a task the search drops stays dropped (off: for that decision only)")
    parser.add_argument("--dagger-rounds", type=int, default=0, help="rounds of search labels on the MAT's states")
    parser.add_argument("--dagger-episodes", type=int, default=64, help="training episodes the MAT plays a round")
    parser.add_argument("--sizes", default="", help="a learning curve over these training-episode counts")
    parser.add_argument("--weight", type=int, default=1, help="repeats of each row where the search leaves the hint")
    parser.add_argument("--export", type=Path, help="export the best-validating stage's MAT here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = comma_list(args.sizes, "--sizes", int)
    if sizes and (sizes != sorted(set(sizes)) or sizes[0] < 1 or args.dagger_rounds):
        parser.error("--sizes: increasing episode counts >= 1, without --dagger-rounds")
    if args.weight < 1:
        parser.error("--weight must be >= 1")
    if args.dagger_rounds and args.persist_drops:
        parser.error("--dagger-rounds: the search labels states it did not reach; give --no-persist-drops")
    with torch_threads(1):
        profile = Profile.load(args.profile)
        module, env = policy_training_env(profile, args)
        if env.rule_hint is None:
            raise ConfigError(f"{args.policy}: the probe needs a MAT trained with --rule-hint")
        cfg = scheduler_config(profile)

        def labels(count: int, offset: int, driver: BatchDecide | None = None) -> Demonstrations:
            search = told_search(args.alternatives, args.seed + offset, args.persist_drops)
            demos = demonstrations(env, search, count, args.seed + 200_000 + offset, driver=driver)
            return demos.rows(takeable(module, demos))

        held = labels(args.held_out, 100_000)
        stages = comma_list(args.epochs, "--epochs", int)

        best = -1.0

        def report(stage: str, epochs: int, fitted: Demonstrations, fit: MATModule) -> None:
            nonlocal best
            (dev_f, on_f, _), (dev_h, on_h, off_h) = taken(fit, fitted), taken(fit, held)
            score = evaluate_policy(fit, env, cfg.eval_episodes, cfg.eval_seed)["success_rate"]
            if args.export and score > best:
                best = score
                export_policy(fit, args.export, env)
                (args.export / "stage.txt").write_text(f"{stage} {100 * score:.2f}\n")
            share = [f"{100 * x:.1f}%" if x == x else "n/a" for x in (dev_f, dev_h, on_f, on_h, off_h)]
            lines.append(f"| {stage} | {epochs} | {len(fitted)} | {share[0]} / {share[1]} | {share[2]} | {share[3]} "
                         f"| {share[4]} | {100 * score:.2f} |")
            print(lines[-1], flush=True)

        drops = "held to the episode's end" if args.persist_drops else "for one decision"
        lines = [f"# Cloning the told search ({args.policy})", "",
                 f"{len(held)} rows of {args.held_out} episodes held out; the search's drops {drops}; rows where it "
                 f"leaves the hint weighed {args.weight} times in a fit. Taken: the share of rows where the MAT's "
                 "greedy joint action is the search's, where the search leaves the hint / elsewhere. A DAgger round "
                 f"(`dN`) adds the rows of {args.dagger_episodes} episodes the MAT played; a stage `nS` is a fresh "
                 "copy of the MAT fitted on the rows of S episodes.", "",
                 "| stage | epochs | rows fitted | search leaves the hint (fitted / held out) | taken there, fitted "
                 "| taken there, held out | taken elsewhere, held out | validation % |",
                 "|---|---|---|---|---|---|---|---|"]
        if sizes:
            fitted = labels(sizes[0], 0)
            for k, size in enumerate(sizes):
                if k:
                    fitted = fitted + labels(size - sizes[k - 1], 400_000 + sizes[k - 1])
                fit = copy.deepcopy(module)
                imitate(fit, weighted(fitted, args.weight), sum(stages), cfg.imitation_lr, args.seed)
                report(f"n{size}", sum(stages), fitted, fit)
        else:
            fitted = labels(args.episodes, 0)
            plan = [("bc", 0), *(("bc", e) for e in stages),
                    *((f"d{r}", stages[-1]) for r in range(1, args.dagger_rounds + 1))]
            total = 0
            for step, (stage, epochs) in enumerate(plan):
                if stage != "bc":
                    fitted = fitted + labels(args.dagger_episodes, 300_000 + 1000 * step,
                                             lambda obs, envs: act(module, obs))
                if epochs:
                    imitate(module, weighted(fitted, args.weight), epochs, cfg.imitation_lr, args.seed + step)
                total += epochs
                report(stage, total, fitted, module)
        return save_table(lines, args.out, "search_clone_probe.md")


if __name__ == "__main__":
    main()
