"""Probe: can the told search's winning candidates be told apart by features made for them?

The MAT does not learn where the told search leaves the teacher, even from
labels that are a function of the state (`search_clone_probe --alternatives
all`). This probe gives another learner the search's own comparison. The
exhaustive told search (the worlds probe's rollout planner in the true world,
every swap and drop, no later arrivals, decisions at events, drops for one
decision) plays `--episodes` ID training episodes, then `--held-out` others.
Each candidate it judges becomes a row of hand-made features and is labelled by
whether its rollout gained over the teacher's. The features describe the task
the candidate takes off its node and the one it puts on (for a drop, none). For
each: its told demand in steps of that node, restore included; its slack to the
deadline; the node's speed; whether the node served it last. A few
state-level figures go with them.

A gradient-boosted classifier is fitted on the first set's rows and read on the
held-out rows:
- ROC AUC;
- at the decisions where some candidate gains, how often the classifier's top
  candidate is one that gains;
- as a rule over the teacher: at every held-out decision take the top candidate
  if its probability is at least 1/2. The table sums those candidates' gains
  (one step each, played to the end by the teacher) as a share of the search's
  own.

    python -m experiments.probes.candidate_probe --profile cluster --episodes 32 --held-out 16

Writes experiments/probes/results/candidate_probe.md, or into --out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import roc_auc_score

from experiments.probes.common import probe_parser, save_table, table_name, told_training_env
from experiments.probes.worlds_probe import told_search
from mara_common.config import ConfigError
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, MultiNodeEnv, sample_episodes
from mara_env.vector import replay_in_lockstep

FEATURES = ("drop", "speed", "out_demand", "out_slack", "out_kept", "in_demand", "in_slack", "in_kept",
            "present", "waiting", "load", "elapsed")


def on_node(env: MultiNodeEnv, task: int, node: int) -> tuple[float, float, float]:
    """(told demand in steps of `node`, restore included; slack to the deadline; 1 if `node` served it last)."""
    kept = env.node_task[node] == task
    restore = env.restore_left[task] if kept else (env.restore_cost[task] if env.last_node[task] >= 0 else 0)
    demand = env.pred[task] / env.speeds[node] + restore
    return float(demand), float(env.deadline[task] - env.t - demand), float(kept)


def candidate_rows(env: MultiNodeEnv, action: np.ndarray, options: list[tuple[str, np.ndarray | int]]) -> np.ndarray:
    """One row of `FEATURES` per candidate."""
    present = env.slot_task[env.slot_task >= 0]
    served = int((action > 0).sum())
    load = env.pred[present].sum() / env.speeds.sum() / max(float(np.mean(env.deadline[present] - env.t)), 1.0)
    state = [len(present), len(present) - served, load, env.t / env.cfg.horizon]
    rows = []
    for kind, x in options:
        if kind == "drop":
            node = int(np.flatnonzero((action > 0) & (env.slot_task[np.maximum(action - 1, 0)] == x))[0])
            out, put = int(x), None
        else:
            node = int(np.flatnonzero(x != action)[0])
            out, put = int(env.slot_task[action[node] - 1]), int(env.slot_task[x[node] - 1])
        incoming = on_node(env, put, node) if put is not None else (0.0, 0.0, 0.0)
        rows.append([float(kind == "drop"), float(env.speeds[node]), *on_node(env, out, node), *incoming, *state])
    return np.array(rows, np.float64)


def judged_candidates(cfg: EnvConfig, episodes: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per judged decision of the exhaustive told search on `episodes` episodes: (features, gains)."""
    decisions: list[tuple[np.ndarray, np.ndarray]] = []
    search = told_search(None, seed, on_judged=lambda env, action, options, gain: decisions.append(
        (candidate_rows(env, action, options), gain.copy())))
    replay_in_lockstep(cfg, sample_episodes(cfg, episodes, seed), search)
    if not decisions:
        raise ConfigError(f"no contended decision in {episodes} episodes: give more, or a heavier load")
    return decisions


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__)
    parser.add_argument("--episodes", type=int, default=32, help="training episodes whose candidates are fitted")
    parser.add_argument("--held-out", type=int, default=16, help="other training episodes, never fitted")
    parser.add_argument("--hold", type=int, default=10, help="the search's decision interval")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with torch_threads(1):
        profile = Profile.load(args.profile)
        cfg = told_training_env(profile, args.bank, args.hold)
        fitted = judged_candidates(cfg, args.episodes, args.seed + 600_000)
        held = judged_candidates(cfg, args.held_out, args.seed + 700_000)
        x, y = np.concatenate([f for f, _ in fitted]), np.concatenate([g for _, g in fitted]) > 0
        model = HistGradientBoostingClassifier(random_state=args.seed).fit(x, y)
        gains = [g for _, g in held]
        scores = [model.predict_proba(f)[:, 1] for f, _ in held]
        flat_y, flat_p = np.concatenate(gains) > 0, np.concatenate(scores)
        auc = roc_auc_score(flat_y, flat_p) if 0 < flat_y.sum() < len(flat_y) else float("nan")
        winning = [g[np.argmax(p)] > 0 for p, g in zip(scores, gains, strict=True) if (g > 0).any()]
        taken = sum(g[np.argmax(p)] for p, g in zip(scores, gains, strict=True) if p.max() >= 0.5)
        best = sum(max(g.max(), 0) for g in gains)
        lines = [f"# The told search's candidates, told apart by hand-made features ({profile.name})", "",
                 f"Exhaustive told search, decisions at events (H = {args.hold}); {len(fitted)} judged decisions of "
                 f"{args.episodes} training episodes fitted, {len(held)} of {args.held_out} others held out. "
                 f"Features: {', '.join(FEATURES)}.", "",
                 "| rows fitted | gaining, fitted | rows held out | gaining, held out | ROC AUC, held out "
                 "| top candidate gains where one does | rule's gain / search's gain |",
                 "|---|---|---|---|---|---|---|",
                 f"| {len(y)} | {100 * y.mean():.1f}% | {len(flat_y)} | {100 * flat_y.mean():.1f}% | {auc:.3f} "
                 f"| {100 * np.mean(winning) if winning else float('nan'):.1f}% | {taken:.0f} / {best:.0f} |"]
        print("\n".join(lines[-3:]), flush=True)
        return save_table(lines, args.out, table_name("candidate_probe", profile))


if __name__ == "__main__":
    main()
