"""Probe: does the teacher leave better actions on the table, even judged with hindsight?

A learned scheduler beats its teacher only where some other action does better.
This plays the teacher (`lara_optimistic` on FM) on frozen ID validation
episodes with decisions at events (`--interval`), and at a share of the states
where it leaves a task waiting, copies the env (`MultiNodeEnv.clone`) and
plays paired rollouts (`experiments.probes.rollout_labels`) of the rest of the
episode: the teacher's own action against up to `--alternatives` candidates of
two kinds,

- *swap*: the teacher's action with one served task replaced by a waiting one,
  held until the next decision, the teacher deciding afterwards;
- *drop*: the teacher giving up one task it serves now, for the rest of the
  episode (as if it had judged it hopeless).

Copies share every arrival and every curve, so a candidate's difference in
successes is its own, exactly; and the rollouts read the true curves, so the
figures bound what any policy could gain by such deviations at those states.
If a better candidate is rare, labels made of them (rollout-based imitation,
AggreVaTe-style) are too sparse to teach a policy to beat the teacher.

With `--policy DIR` (a MAT trained with decisions at events, e.g. a run's
`warm_start_policy`), it instead fits that MAT to such labels on the states it
reaches itself (`experiments.probes.rollout_labels.RolloutLabeller`, ID training
episodes), round after round, and validates it after each round as the
trainer does (greedy, its 128 ID val episodes); `--weight W` repeats every
state where a candidate beat the teacher W times in the fit. At those states
it also reports how often the MAT's greedy joint action is the label, before
the round's fit and after it: whether the MAT learns the labels at all, and
whether what it learned carries to states it was not fitted on. With
`--memorise E1,E2,...` it labels two disjoint sets of `--episodes` training
episodes instead, fits copies of the MAT to the first set's improved states
alone for each epoch count, and reports the label taken on both sets.

Validation curves only (ID val) for the figures. Run from the project root:

    python -m experiments.probes.rollout_probe --roots 5
    python -m experiments.probes.rollout_probe --policy artifacts/scheduler/RUN/warm_start_policy --rounds 4

Writes experiments/probes/results/rollout_probe.md (with --policy,
rollout_fit.md), or into --out.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from pathlib import Path

import numpy as np
import torch
from ray.rllib.core.columns import Columns

from experiments.probes.common import probe_parser, save_table
from experiments.probes.rollout_labels import (
    KINDS,
    RolloutLabeller,
    blind_teacher,
    candidates,
    judge,
)
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.cluster import ClusterConfig
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import replay_in_lockstep
from mara_rl.evaluate import pooled_episodes
from mara_rl.imitation import Demonstrations, demonstrations, imitate
from mara_rl.mat_module import MATModule
from mara_rl.policy import act, load_policy, policy_env
from mara_rl.scheduler_config import scheduler_config, training_env
from mara_rl.train_scheduler import evaluate_policy

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


def improved_states(labeller: RolloutLabeller) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The states where a candidate beat the teacher, stacked, and their labels."""
    obs = {k: np.stack([o[k] for o, _ in labeller.improved]) for k in labeller.improved[0][0]}
    return obs, np.stack([a for _, a in labeller.improved])


def improved_rows(module: torch.nn.Module, labeller: RolloutLabeller) -> Demonstrations:
    """The states where a candidate beat the teacher, with their labels (returns: the MAT's own
    values, so the repeated rows leave the value fit as it is)."""
    states, labels = improved_states(labeller)
    obs = {k: torch.as_tensor(v) for k, v in states.items()}
    actions = torch.as_tensor(labels, dtype=torch.long)
    with torch.no_grad():
        out = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})
        values = module.compute_values({Columns.OBS: obs}, out.get(Columns.EMBEDDINGS))
    return Demonstrations(obs=obs, actions=actions, returns=values.float())


def takes(module: MATModule, obs: dict[str, np.ndarray], labels: np.ndarray) -> np.ndarray:
    """Per stacked state, whether the MAT's greedy joint action is the label."""
    return np.all(act(module, obs) == labels, axis=1)


def label_share(module: MATModule, labeller: RolloutLabeller) -> float:
    """How often the MAT's greedy joint action is the label at the states where a candidate beat
    the teacher (NaN if there were none): does it take the better action there?"""
    if not labeller.improved:
        return float("nan")
    return float(np.mean(takes(module, *improved_states(labeller))))


def policy_training_env(profile: Profile, args: argparse.Namespace) -> tuple[MATModule, EnvConfig]:
    """The MAT of `--policy` and the training env it runs in (its predictor and view options)."""
    trained = policy_env(args.policy)
    cluster = trained.pop("cluster")
    env = dataclasses.replace(training_env(scheduler_config(profile), profile, args.bank or profile.paths.bank),
                              **trained, cluster=ClusterConfig(**cluster))
    return load_policy(args.policy), env


def fit(profile: Profile, args: argparse.Namespace) -> list[str]:
    """Rounds of rollout labels on the MAT's own states, each followed by a refit and a validation."""
    module, env = policy_training_env(profile, args)
    cfg = scheduler_config(profile)
    # Fixed offsets from --seed: the teacher's demonstrations, each round's labeller and training
    # episodes, and each refit draw apart (the figures in docs/experiments.md are --seed 0's).
    demos = demonstrations(env, TEACHER, cfg.imitation_episodes, args.seed + 7)
    start = evaluate_policy(module, env, cfg.eval_episodes, cfg.eval_seed)["success_rate"]
    lines = [f"# Fitting the MAT to rollout labels ({args.policy}, decisions at events every "
             f"<= {env.decision_interval} steps)", "",
             f"Validation: {cfg.eval_episodes} ID val episodes, greedy; before the first round {100 * start:.2f}%.",
             "", "At the states where a candidate beat the teacher, the share where the MAT's greedy joint "
             "action is that candidate: before the round's fit (states it has not been fitted on) and after.",
             "", "| round | rows | states judged | a candidate beat the teacher | label taken before / after the fit "
             "| validation % |", "|---|---|---|---|---|---|"]
    for r in range(1, args.rounds + 1):
        labeller = RolloutLabeller(TEACHER, args.alternatives // 2, args.share, seed=args.seed + 99 + r)
        rows = demonstrations(env, labeller, args.episodes, args.seed + 4900 + 100 * r,
                              driver=lambda obs, envs: act(module, obs))
        demos = demos + rows
        before = label_share(module, labeller)
        for _ in range(args.weight - 1 if labeller.improved else 0):
            demos = demos + improved_rows(module, labeller)
        imitate(module, demos, cfg.imitation_dagger_epochs, cfg.imitation_lr, args.seed + 10 + r)
        score = evaluate_policy(module, env, cfg.eval_episodes, cfg.eval_seed)["success_rate"]
        gains = np.array(labeller.gains)
        improved = f"{100 * np.mean(gains > 0):.1f}%" if len(gains) else "n/a"
        taken = f"{100 * before:.1f}% / {100 * label_share(module, labeller):.1f}%" if labeller.improved else "n/a"
        lines.append(f"| {r} | {len(rows)} | {len(gains)} | {improved} | {taken} | {100 * score:.2f} |")
        print(lines[-1], flush=True)
    return lines


def memorise(profile: Profile, args: argparse.Namespace) -> list[str]:
    """Can the MAT learn the labels, and do they carry? Labels on its own states in two disjoint
    sets of training episodes; copies fitted on the first set's improved states alone."""
    module, env = policy_training_env(profile, args)
    cfg = scheduler_config(profile)
    sets = []
    for k in range(2):
        labeller = RolloutLabeller(TEACHER, args.alternatives // 2, args.share, seed=args.seed + 500 + k)
        demonstrations(env, labeller, args.episodes, args.seed + 9000 + 1000 * k,
                       driver=lambda obs, envs: act(module, obs))
        if not labeller.improved:
            raise ValueError(f"no candidate beat the teacher in label set {k}: use more --episodes")
        sets.append(labeller)
    lines = [f"# Fitting the MAT to rollout labels alone ({args.policy})", "",
             f"Improved states: {len(sets[0].improved)} in the fitted set, {len(sets[1].improved)} in the "
             f"held-out one ({args.episodes} training episodes each). Label taken: the share of them where "
             "the MAT's greedy joint action is the label.", "",
             "| fit epochs | label taken, fitted set | label taken, held-out set |", "|---|---|---|"]
    rows = improved_rows(module, sets[0])
    for epochs in [0, *args.memorise]:
        fitted = copy.deepcopy(module)
        if epochs:
            imitate(fitted, rows, epochs, cfg.imitation_lr, args.seed + 1)
        lines.append(f"| {epochs} | {100 * label_share(fitted, sets[0]):.1f}% | {100 * label_share(fitted, sets[1]):.1f}% |")
        print(lines[-1], flush=True)
    return lines


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True, roots=True)
    parser.add_argument("--interval", type=int, default=10, help="decision_interval of the replayed env")
    parser.add_argument("--share", type=float, default=0.25, help="share of contended states judged")
    parser.add_argument("--alternatives", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", type=Path, help="fit this MAT to rollout labels instead (see above)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=32, help="training episodes per round")
    parser.add_argument("--weight", type=int, default=1, help="repeats of each improved state in the fit")
    parser.add_argument("--memorise",
                        help="with --policy: instead of rounds, fit the MAT to the improved states of one "
                        "label set alone for these epoch counts (e.g. 20,100,300), see above")
    args = parser.parse_args(argv)
    args.memorise = comma_list(args.memorise, "--memorise", int)
    with torch_threads(1):
        profile = Profile.load(args.profile)
        if args.policy and args.memorise:
            return save_table(memorise(profile, args), args.out, "rollout_memorise.md")
        if args.policy:
            return save_table(fit(profile, args), args.out, "rollout_fit.md")
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
