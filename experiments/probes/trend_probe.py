"""Probe: does a task's own loss trend tell what FM's forecasts do not?

Under the teacher (`lara_optimistic` on FM), every judged task (past its probe
points) at every step of ID *train* episodes is a row: its slot features and
whether it could truly still be finished by its deadline (the privileged
critic's flag, `EnvConfig.critic_features`). A gradient-boosted classifier is
fitted on FM's features alone (median, optimistic estimate, time to deadline)
and with the trend features (`EnvConfig.trend_window`: progress and its
projection), then scored on the rows of ID *val* episodes. Then the
classifier joins the teacher on the trainer's validation episodes: a judged
task it calls infeasible (P < τ) is dropped, one it calls feasible keeps at
most its time left as demand. The first part says whether the information
exists; the second whether a scheduler acting on it gains.

Train and validation curves only. Run from the project root (one OpenMP thread keeps the
classifier from starving other jobs):

    OMP_NUM_THREADS=1 python -m experiments.probes.trend_probe --train-episodes 32 --taus 0.1,0.2,0.3,0.5

Writes experiments/probes/results/trend_probe.md, or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import log_loss, roc_auc_score

from experiments.probes.common import probe_parser, save_table
from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.allocators import OptimisticLARA
from mara_env.env import EnvConfig, MultiNodeEnv, sample_episodes
from mara_env.vector import BatchDecide, replay_in_lockstep
from mara_rl.methods import classic
from mara_rl.scheduler_config import scheduler_config, training_env

# Slot-feature columns (docs/design.md §3): 1 median, 2 time to deadline, then with
# `optimistic_quantile` and `probe_points` on, 4 optimistic and 5 probe; the trend's two come last.
FM_COLUMNS, OPTIMISTIC_COLUMN, PROBE_COLUMN = [1, 2, 4], 4, 5
TRAIN_SEED = 5_000_000  # apart from the trainer's imitation and validation seeds


def feature_sets(env: EnvConfig) -> dict[str, list[int]]:
    """The classifier's columns: FM's features alone, and with the trend's two."""
    if env.optimistic_quantile is None or env.probe_points is None or env.trend_window is None:
        raise ConfigError("the trend probe needs optimistic_quantile, probe_points and trend_window set "
                          "(the profile's [env], --probe-points, --trend-window)")
    return {"FM": FM_COLUMNS, "FM + trend": [*FM_COLUMNS, env.slot_features - 2, env.slot_features - 1]}


def judged_rows(env: EnvConfig, episodes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(slot features, truly finishable) of every judged task at every step under the teacher."""
    features, finishable = [], []

    def record(i: int, obs: dict[str, np.ndarray], action: np.ndarray, reward: float) -> None:
        judged = (obs["slot_mask"] > 0) & (obs["slots"][:, PROBE_COLUMN] >= 1.0)
        features.append(obs["slots"][judged])
        finishable.append(obs["critic_slots"][judged, 1])

    replay_in_lockstep(env, sample_episodes(env, episodes, seed), classic("lara_optimistic")(), on_step=record)
    return np.concatenate(features), np.concatenate(finishable)


def teacher_with(model: HistGradientBoostingClassifier, columns: list[int], tau: float) -> BatchDecide:
    """The teacher, with a judged task's optimistic demand set by the classifier's call (one
    classifier call per step for all envs)."""
    teacher = OptimisticLARA()

    def decide(obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        views = [env.scheduler_view() for env in envs]
        judged = [np.flatnonzero(v.present & (v.observed >= v.probe_points)) for v in views]
        rows = np.concatenate([slots[j][:, columns] for slots, j in zip(obs["slots"], judged, strict=True)])
        calls = np.split(model.predict_proba(rows)[:, 1] if len(rows) else rows[:, 0],
                         np.cumsum([len(j) for j in judged])[:-1])
        actions = []
        for view, slots, p in zip(views, judged, calls, strict=True):
            optimistic = view.optimistic.copy()
            optimistic[slots[p < tau]] = np.inf
            keep = slots[p >= tau]
            optimistic[keep] = np.minimum(optimistic[keep], np.maximum(view.deadline[keep] - view.t, 1))
            actions.append(teacher.act(dataclasses.replace(view, optimistic=optimistic)))
        return np.stack(actions)

    return decide


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True)
    parser.add_argument("--trend-window", type=int, default=8)
    parser.add_argument("--probe-points", type=int, help="judge tasks after this many points "
                        "(default: the profile's [env] probe_points)")
    parser.add_argument("--train-episodes", type=int, default=32)
    parser.add_argument("--val-episodes", type=int, default=40, help="episodes whose rows score the classifier")
    parser.add_argument("--taus", default="0.1,0.2,0.3,0.5", help="classifier thresholds τ, comma-separated")
    parser.add_argument("--episodes", type=int, help="validation episodes of the scheduling part "
                        "(default: the profile's eval_episodes)")
    args = parser.parse_args(argv)
    with torch_threads(1):
        profile = Profile.load(args.profile)
        cfg = scheduler_config(profile, predictor="fm", fm_path=str(args.fm) if args.fm else None)
        env = training_env(cfg, profile, args.bank or profile.paths.bank)
        env = dataclasses.replace(env, burst_prob=0.0, trend_window=args.trend_window, critic_features=True,
                                  probe_points=args.probe_points or env.probe_points)
        features = feature_sets(env)
        val = dataclasses.replace(env, split="val")
        x_train, y_train = judged_rows(env, args.train_episodes, TRAIN_SEED)
        x_val, y_val = judged_rows(val, args.val_episodes, cfg.eval_seed)
        lines = [f"# What the trend tells (profile {profile.name}, W = {args.trend_window})", "",
                 f"Judged tasks under the teacher: {len(x_train)} rows of {args.train_episodes} ID train episodes fit "
                 f"the classifier, {len(x_val)} rows of {args.val_episodes} ID val episodes score it "
                 f"({100 * y_val.mean():.1f}% finishable). Rule: the teacher's own call, optimistic demand ≤ time left.",
                 "", "| features | AUC | log loss | accuracy |", "|---|---|---|---|",
                 f"| teacher's rule | — | — | {100 * np.mean((x_val[:, OPTIMISTIC_COLUMN] <= x_val[:, 2]) == y_val):.2f} |"]
        models = {}
        for name, columns in features.items():
            models[name] = HistGradientBoostingClassifier(max_iter=200, random_state=0).fit(x_train[:, columns], y_train)
            p = models[name].predict_proba(x_val[:, columns])[:, 1]
            lines.append(f"| {name} | {roc_auc_score(y_val, p):.4f} | {log_loss(y_val, p):.4f} | "
                         f"{100 * np.mean((p > 0.5) == y_val):.2f} |")
            print(lines[-1], flush=True)
        episodes = sample_episodes(val, args.episodes or cfg.eval_episodes, cfg.eval_seed)

        def rate(decide: BatchDecide) -> float:
            return 100 * float(np.mean([o["success_rate"] for o in replay_in_lockstep(val, episodes, decide)]))

        taus = comma_list(args.taus, "--taus", float)
        lines += ["", f"The teacher with the classifier's call, success % on the trainer's {len(episodes)} ID val "
                  f"episodes (the teacher alone: {rate(classic('lara_optimistic')()):.2f}):", "",
                  "| features | " + " | ".join(f"τ = {t:g}" for t in taus) + " |", "|---|" + "---|" * len(taus)]
        for name, columns in features.items():
            lines.append(f"| {name} | " + " | ".join(f"{rate(teacher_with(models[name], columns, t)):.2f}"
                                                    for t in taus) + " |")
            print(lines[-1], flush=True)
        return save_table(lines, args.out, "trend_probe.md")


if __name__ == "__main__":
    main()
