"""Probe: which of FM's sorted crossings should the rules read as the optimistic estimate?

The teacher (`lara_optimistic`) and `llf` plan on the order statistic round(q·(M − 1)) of
FM's M sampled crossings (`EnvConfig.optimistic_quantile`, docs/decisions.md,
"Optimistic estimate"). The best q depends on how FM's spread is calibrated, so it is
measured again whenever the predictor changes. Each rule replays frozen ID val episodes
at every q, at each of FM's sampler seeds (its fixed base-noise draw moves a rule about as
much as q does), and the table gives the mean over draws with the paired difference
against `--reference`: a hierarchical bootstrap over draws and episodes.

`--load` replays the episodes at another arrival probability, `--stress` the stress
scenario built from ID val curves instead, `--trainer-episodes` the scheduler trainer's
validation episodes instead (`hold_probe`'s), `--hold H` the rules deciding at events, and
`--profile cluster` the cluster. Validation curves only. Below the table: with several
draws, each episode's own q chosen on the other draws and scored on the left-out one (what
an episode-level choice of q could add); and the rules' success within terciles of the
episodes' task counts (whether the best q follows an episode's load). Run from the project root:

    python -m experiments.probes.quantile_probe --quantiles 0,0.07,0.15,0.2 --sampler-seeds 0,1,2

Writes experiments/probes/results/quantile_probe[_<profile>][_<variant>].md, or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from experiments.probes.common import (
    difference_text,
    probe_parser,
    save_table,
    table_name,
    trainer_val_episodes,
)
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, load_curves
from mara_env.vector import replay_in_lockstep
from mara_env.workload import stress_episode
from mara_fm.predictors import FMPredictor
from mara_rl.evaluate import pooled_episodes
from mara_rl.methods import classic
from mara_rl.stats import hierarchical_bootstrap

RULES = ("lara_optimistic", "llf")


def per_episode_choice(at_q: dict[float, np.ndarray]) -> tuple[float, float]:
    """Leave one draw out: each episode's best q on the other draws, scored on the left-out
    draw, against the best single q chosen on the same draws (means over the left-out draws).
    What an episode-level choice of q could add if it knew the episode, without counting
    the sampler's noise as signal."""
    rates = np.stack(list(at_q.values()))  # q × draws × episodes
    n_draws, episodes = rates.shape[1], np.arange(rates.shape[2])
    chosen, single = [], []
    for out in range(n_draws):
        fit = rates[:, [d for d in range(n_draws) if d != out]]
        chosen.append(rates[fit.mean(axis=1).argmax(axis=0), out, episodes].mean())
        single.append(rates[fit.mean(axis=(1, 2)).argmax(), out].mean())
    return float(np.mean(chosen)), float(np.mean(single))


def by_episode_size(per: dict[str, dict[float, np.ndarray]], tasks: list[int]) -> list[str]:
    """The rules' success at each q within terciles of the episodes' task counts: whether
    the best q depends on how loaded an episode is (a load-aware estimate would read it)."""
    counts = np.asarray(tasks)
    tercile = np.digitize(counts, np.quantile(counts, [1 / 3, 2 / 3]), right=True)
    quantiles = list(next(iter(per.values())))
    lines = ["", "By the episode's number of tasks (terciles): success %, mean over draws.", "",
             "| rule | tasks | episodes | " + " | ".join(f"q = {q:g}" for q in quantiles) + " |",
             "|---|---|---|" + "---|" * len(quantiles)]
    for rule, at_q in per.items():
        for t in range(3):
            mask = tercile == t
            if mask.any():
                lines.append(f"| {rule} | {counts[mask].min()}–{counts[mask].max()} | {mask.sum()} | "
                             + " | ".join(f"{at_q[q][:, mask].mean():.2f}" for q in quantiles) + " |")
    return lines


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True, roots=True)
    parser.add_argument("--quantiles", default="0,0.07,0.15,0.2", help="optimistic quantiles q, comma-separated")
    parser.add_argument("--reference", type=float, default=0.15, help="the q the others are paired against")
    parser.add_argument("--sampler-seeds", default="0", help="FM's base-noise draws, comma-separated")
    parser.add_argument("--rules", default=",".join(RULES), help="rules reading the estimate, comma-separated")
    parser.add_argument("--load", type=float, help="arrival probability (default: the profile's)")
    parser.add_argument("--hold", type=int, help="the rules decide at events, holding up to H steps")
    parser.add_argument("--stress", action="store_true",
                        help="the stress scenario from ID val curves, one episode per root")
    parser.add_argument("--trainer-episodes", action="store_true",
                        help="the scheduler trainer's validation episodes ([scheduler] eval_episodes from eval_seed)")
    args = parser.parse_args(argv)
    quantiles = comma_list(args.quantiles, "--quantiles", float)
    draws = comma_list(args.sampler_seeds, "--sampler-seeds", int)
    rules = comma_list(args.rules, "--rules")
    if sum([args.stress, args.trainer_episodes, args.load is not None]) > 1:
        parser.error("--stress, --trainer-episodes and --load each choose the episodes: give one of them")
    if args.reference not in quantiles or not draws or not set(rules) <= set(RULES):
        parser.error(f"--quantiles must hold --reference, --sampler-seeds at least one seed, --rules of {RULES}")

    profile = Profile.load(args.profile)
    base = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), task_set="id", split="val")
    base = dataclasses.replace(base, arrival_prob=args.load if args.load is not None else base.arrival_prob,
                               decision_interval=args.hold)
    if args.stress:
        curves = load_curves(base.bank, "id", "val")
        episodes = [stress_episode(curves, base.horizon, seed=root) for root in range(args.roots)]
    elif args.trainer_episodes:
        trainer, episodes = trainer_val_episodes(profile, Path(base.bank), args.fm)
        base = dataclasses.replace(trainer, decision_interval=args.hold)
    else:
        episodes = pooled_episodes(base, args.roots, args.episodes_per_root)
    fm = FMPredictor.load(args.fm or profile.paths.predictor)
    at_draw = {draw: fm.resampled(draw) for draw in draws}
    # per[rule][q]: draws × episodes success rates (%)
    per: dict[str, dict[float, np.ndarray]] = {rule: {} for rule in rules}
    with torch_threads(1):
        for rule in rules:
            for q in quantiles:
                rows = []
                for draw in draws:
                    cfg = dataclasses.replace(base, optimistic_quantile=q, predictor=at_draw[draw])
                    rows.append([100 * o["success_rate"] for o in replay_in_lockstep(cfg, episodes, classic(rule)())])
                per[rule][q] = np.array(rows)
                print(f"[quantile] {rule} q = {q:g}: " + " / ".join(f"{r:.2f}" for r in per[rule][q].mean(axis=1)),
                      flush=True)

    scope = ("stress episodes" if args.stress else
             f"ID val episodes {'of the scheduler trainer ' if args.trainer_episodes else ''}at p = "
             f"{base.arrival_prob}") + (
        f", decisions held up to {args.hold} steps" if args.hold else "")
    lines = [f"# The rules' optimistic order statistic (profile {profile.name}, M = {fm.samples})", "",
             f"{len(episodes)} {scope}, FM's sampler seeds {draws}. Success %, mean over draws (per draw), and "
             f"the paired difference against q = {args.reference:g} (95% hierarchical bootstrap over draws and "
             "episodes). Order statistic: round(q·(M − 1)), 0 the smallest.", "",
             "| rule | q | order statistic | success | per draw | vs reference |", "|---|---|---|---|---|---|"]
    for rule in rules:
        for q in quantiles:
            rates = per[rule][q]
            if q == args.reference:
                versus = "—"
            else:
                versus = difference_text(hierarchical_bootstrap(rates - per[rule][args.reference]))
            lines.append(f"| {rule} | {q:g} | {round(q * (fm.samples - 1))} | {rates.mean():.2f} | "
                         + " / ".join(f"{r:.2f}" for r in rates.mean(axis=1)) + f" | {versus} |")
    if len(draws) > 1:
        lines += ["", "Each episode's own q, chosen on the other draws and scored on the left-out one, against the "
                  "best single q chosen on the same draws (mean over left-out draws): an upper bound for an "
                  "episode-level choice of q that does not count the sampler's noise as signal.", ""]
        lines += [f"- {rule}: {mine:.2f} against {single:.2f} ({mine - single:+.2f})"
                  for rule in rules for mine, single in [per_episode_choice(per[rule])]]
    if not args.stress:
        lines += by_episode_size(per, [len(e.curve_ids) for e in episodes])
    variant = "_stress" if args.stress else (f"_p{base.arrival_prob:g}" if args.load is not None else "")
    variant += "_trainer" if args.trainer_episodes else ""
    variant += f"_hold{args.hold}" if args.hold else ""
    return save_table(lines, args.out, table_name("quantile_probe", profile, variant))


if __name__ == "__main__":
    main()
