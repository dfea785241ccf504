"""Probe: does an ensemble of one recipe's training seeds decide better than its members?

Seeds of a recipe depart from their shared teacher in different places (docs/experiments.md,
"A privileged critic"); an ensemble keeps the departures its members agree on. It decodes
the joint action node by node, in the MAT's order, each node taking the action with the
highest sum of the members' log-probabilities given the nodes decided before it (greedy,
masked as each member masks). A group `NAME=DIR+DIR+...` is one ensemble; the groups are the
replicates of one ensemble variant, so the table pairs them with each rule of `--rules` by a
hierarchical bootstrap over replicates and episodes, beside the members alone. Frozen ID
validation episodes only (`--first-root` picks a set that chose nothing). Run from the
project root:

    python -m experiments.probes.ensemble_probe --groups e0=A+B+C,e1=D+E+F,e2=G+H+I \
        --rules lara_fm_optimistic_held,llf_fm_held --roots 16

Writes experiments/probes/results/ensemble_probe[_<profile>].md, or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from ray.rllib.core.columns import Columns

from experiments.probes.common import difference_text, probe_parser, save_table, table_name
from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.paths import normal_path
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig
from mara_env.vector import BatchDecide
from mara_env.workload import Episode
from mara_rl.evaluate import evaluate_method, pooled_episodes
from mara_rl.mat_module import MATModule
from mara_rl.methods import Method, builtin_methods, learned, unavailable
from mara_rl.policy import load_policy
from mara_rl.stats import difference_matrix, hierarchical_bootstrap


def ensemble_act(members: list[MATModule], obs: dict[str, np.ndarray]) -> np.ndarray:
    """Greedy joint actions (B, N) of the ensemble on a stacked batch of observations."""
    batch = {k: torch.as_tensor(np.asarray(v)) for k, v in obs.items()}
    n_nodes = members[0].n_nodes
    actions = torch.zeros(batch["slot_mask"].shape[0], n_nodes, dtype=torch.long)
    with torch.inference_mode():
        for node in range(n_nodes):  # row `node` reads actions[:, :node] only (MATModule._decode)
            score = sum(F.log_softmax(m.forward_train({Columns.OBS: batch, Columns.ACTIONS: actions})
                                      [Columns.ACTION_DIST_INPUTS].view(len(actions), n_nodes, -1)[:, node], -1)
                        for m in members)
            actions[:, node] = score.argmax(-1)
    return actions.numpy()


def ensemble(name: str, dirs: list[str]) -> Method:
    """The ensemble of the policies in `dirs`, run in the env its first member was trained in."""
    def make() -> BatchDecide:
        members = [load_policy(d) for d in dirs]
        return lambda obs, envs: ensemble_act(members, obs)

    return dataclasses.replace(learned(name, dirs[0]), make=make)


def success(method: Method, base: EnvConfig, episodes: list[list[Episode]]) -> np.ndarray:
    """Per-episode success rates (%) of `method`, in frozen-episode order."""
    return 100 * np.concatenate(evaluate_method(method, base, episodes)["per_root"])


def interval(a: dict, b: np.ndarray) -> str:
    return difference_text(hierarchical_bootstrap(difference_matrix(a, {None: b})))


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True, roots=True)
    parser.add_argument("--groups", required=True, help="ensembles NAME=POLICY_DIR+POLICY_DIR+..., comma-separated")
    parser.add_argument("--rules", default="lara_fm_optimistic_held,llf_fm_held",
                        help="registry rules the ensembles are paired with, comma-separated")
    parser.add_argument("--first-root", type=int, default=0, help="the first frozen evaluation root")
    args = parser.parse_args(argv)
    groups = {}
    for item in comma_list(args.groups, "--groups"):
        name, _, dirs = item.partition("=")
        if not name or not dirs:
            raise ConfigError(f"--groups entry {item!r} should be NAME=POLICY_DIR+POLICY_DIR+...")
        groups[name] = dirs.split("+")
    rule_names = comma_list(args.rules, "--rules")

    profile = Profile.load(args.profile)
    base = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), task_set="id", split="val")
    alone = {d: learned(d, d) for dirs in groups.values() for d in dirs}
    trained_in = {(m.predictor, str(m.view), str(m.cluster)) for m in alone.values()}
    if len(trained_in) != 1:
        raise ConfigError(f"--groups: the policies were trained in different envs ({sorted(trained_in)}); "
                          "an ensemble's members must share their predictor, view and cluster")
    rules = builtin_methods(normal_path(args.fm or profile.paths.predictor), base.view_options)
    if missing := unavailable(rule_names, rules):
        raise ConfigError(f"--rules: cannot run {missing}")
    per = args.episodes_per_root
    flat = pooled_episodes(base, args.first_root + args.roots, per)[args.first_root * per:]
    episodes = [flat[i:i + per] for i in range(0, len(flat), per)]

    with torch_threads(1):
        at_rule = {name: success(rules[name], base, episodes) for name in rule_names}
        scores = {d: success(m, base, episodes) for d, m in alone.items()}
        together = {name: success(ensemble(name, dirs), base, episodes) for name, dirs in groups.items()}
    for name, rates in {**at_rule, **together}.items():
        print(f"[ensemble] {name}: {rates.mean():.2f}", flush=True)

    replicates = dict(enumerate(together.values()))
    members = dict(enumerate(scores.values()))
    lines = [f"# Seed ensembles of exported policies (profile {profile.name})", "",
             f"{len(flat)} frozen ID val episodes (roots {args.first_root}–{args.first_root + args.roots - 1} × "
             f"{args.episodes_per_root}, p = {base.arrival_prob}). Success %; the members scored alone on the "
             "same episodes.", "",
             "| ensemble | members | ensemble % | members alone % | ensemble − members' mean |", "|---|---|---|---|---|"]
    for name, dirs in groups.items():
        own = np.mean([scores[d].mean() for d in dirs])
        lines.append(f"| {name} | {len(dirs)} | {together[name].mean():.2f} | "
                     + " / ".join(f"{scores[d].mean():.2f}" for d in dirs) + f" | {together[name].mean() - own:+.2f} |")
    lines += ["", "Against each rule: paired differences in points, 95% hierarchical bootstrap over the "
              f"{len(replicates)} ensembles (or the {len(members)} members alone) and the episodes.", "",
              "| rule | rule % | ensembles − rule | members alone − rule |", "|---|---|---|---|"]
    lines += [f"| {name} | {rates.mean():.2f} | {interval(replicates, rates)} | {interval(members, rates)} |"
              for name, rates in at_rule.items()]
    return save_table(lines, args.out, table_name("ensemble_probe", profile))


if __name__ == "__main__":
    main()
