"""Probe: does planning over FM's sampled worlds beat the teacher, which reads one sample?

A world draws, for every task past its warm-up, one of FM's M sampled crossings
(independently per task). Two planners use them:

- `served` / `kept` (hindsight optimisation): at each step the exact planner
  (`llf`: exact N-node feasibility, least-laxity service) plans each of W worlds
  as if its demands were true, and the tasks are ranked by how many worlds serve
  (or keep) them now.
- `rollout` (one step of policy iteration over the teacher): at each contended
  decision (decisions at events, each held up to `--hold` steps) the teacher's
  joint action competes with `--alternatives` swaps and as many drops, drawn
  at random (`all`: every one; `experiments.probes.rollout_labels`); each is
  played to the episode's end by the teacher in each of W worlds, the same
  worlds for every candidate, and a candidate replaces the teacher's action
  only if its mean gain is at least `--delta` successes and two standard errors
  above 0 (the argmax of W noisy sums otherwise changes half the decisions for
  nothing). In a world a task's curve is bent to reach ε at its drawn
  crossing; the rolled-out teacher reads the forecasts of the decision (minus
  the batches served since) for tasks already forecast, and the world's demand
  for the others. A task the planner drops stays dropped
  (`--no-persist-drops`: for that decision only).
  Tasks still in warm-up draw their demand from the true demands of training
  tasks. Future arrivals are the episode's own (a leak in the planner's favour),
  or none with `--no-arrivals-ahead`.
  `hindsight` is the same planner in the one true world, the teacher reading the
  true demand in it: what the search finds when it knows everything.

`--exact` runs every row in an env that reads the true demand (the `oracle`
predictor), so the rules are told it. `hindsight` with `--no-arrivals-ahead` is
then one step of policy iteration over the told teacher that uses nothing the
told rules do not see: how much better a policy with their information could
decide.

Validation episodes only.

    python -m experiments.probes.worlds_probe --worlds 16 --loads 0.04,0.07
    python -m experiments.probes.worlds_probe --planners rollout,hindsight --worlds 8 [--profile cluster]
    python -m experiments.probes.worlds_probe --planners hindsight --exact --no-arrivals-ahead --profile cluster
    python -m experiments.probes.worlds_probe --planners rollout,hindsight --worlds 8 --recall

`--recall` feeds every row, and draws the rollout worlds, from the recall predictor (FM with its
training runs as a memory) instead of FM.

Writes experiments/probes/results/worlds_probe.md, or into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

from experiments.probes.common import (
    add_alternatives_flag,
    probe_parser,
    save_table,
    success,
    table_name,
)
from experiments.probes.rollout_labels import KINDS, candidates, view_without
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.allocators import LARA, can_meet_deadlines, joint_action
from mara_env.env import ACTIVE, WAITING, EnvConfig, MultiNodeEnv
from mara_env.registry import ALLOCATORS
from mara_env.vector import BatchDecide, replay_in_lockstep
from mara_env.workload import true_demand
from mara_fm.bank import CurveSet
from mara_fm.predictors import WARMUP_POINTS, FMPredictor, RecallPredictor, SampledPredictor
from mara_fm.predictors.base import HistoryBatch
from mara_rl.evaluate import pooled_episodes

TEACHER = "lara_optimistic"
Judged = Callable[[MultiNodeEnv, np.ndarray, list[tuple[str, np.ndarray | int]], np.ndarray], None]


class SampleKeepingFM(FMPredictor):
    """FM that also remembers each answered prefix's M sorted crossings (inf: never)."""

    def __init__(self, fm: FMPredictor) -> None:
        super().__init__(fm.model, fm.cfg, fm.stats)
        self.kept_crossings: dict[tuple[int, int], np.ndarray] = {}

    def replay_remaining(self, source: CurveSet, rows: np.ndarray, lengths: np.ndarray, eps: np.ndarray,
                         horizon: np.ndarray, optimistic: float | None = None) -> np.ndarray:
        out = super().replay_remaining(source, rows, lengths, eps, horizon, optimistic)
        hist = HistoryBatch.from_curves(source.avg[rows], lengths, source.batch_size[rows], source.lr[rows])
        crossings = self.sorted_crossings(hist, eps, horizon)
        crossings = np.where(crossings >= horizon[:, None], np.inf, crossings)
        crossings[hist.current <= eps] = 0.0
        for r, n, c in zip(rows.tolist(), lengths.tolist(), crossings, strict=True):
            self.kept_crossings[(r, n)] = c
        return out


PLANNERS = ("served", "kept", "rollout", "hindsight")


def plan_world(slots: list[int], demand: np.ndarray, time_left: np.ndarray, n_nodes: int) -> list[int]:
    """llf on one world: the kept set (EDF walk, exact test), least laxity first."""
    kept: list[int] = []
    for s in sorted(slots, key=lambda s: (time_left[s], s)):
        if demand[s] > time_left[s]:
            continue
        kept.append(s)
        if not can_meet_deadlines(demand[kept], time_left[kept], n_nodes):
            kept.remove(max(kept, key=lambda k: demand[k]))
    return sorted(kept, key=lambda s: (time_left[s] - demand[s], time_left[s], s))


def worlds_decide(fm: SampleKeepingFM, worlds: int, vote: str, seed: int = 0) -> BatchDecide:
    """Rank tasks by the worlds that serve them now (`vote` = "served") or keep them ("kept");
    tasks before their judgement point first, EDF, as the teacher does."""
    def decide(obs, envs):
        actions = []
        for env in envs:
            view = env.scheduler_view()
            slots = np.flatnonzero(view.present)
            edf = slots[np.lexsort((view.arrival[slots], view.deadline[slots]))]
            judged = view.probe_points or 4
            warm = [s for s in edf if view.observed[s] < judged]
            rest = [s for s in edf if view.observed[s] >= judged]
            time_left = (view.deadline - view.t).astype(np.float64)
            score = np.zeros(len(view.present))
            if rest:
                tasks = env.slot_task[rest]
                samples = np.stack([fm.kept_crossings[(int(env.task_rows[k]), int(env.n_obs[k]))] for k in tasks])
                rng = np.random.default_rng([seed, env.t, int(tasks.sum())])
                pick = rng.integers(0, samples.shape[1], (worlds, len(rest)))
                free = view.n_nodes - len(warm)
                for w in range(worlds):
                    demand = np.zeros(len(view.present))
                    demand[rest] = np.maximum(samples[np.arange(len(rest)), pick[w]], 1.0)
                    order = plan_world(rest, demand, time_left, view.n_nodes)
                    chosen = order[:max(free, 0)] if vote == "served" else order
                    score[chosen] += 1
            ranked = sorted(rest, key=lambda s: (-score[s], time_left[s], s))
            actions.append(joint_action(warm + ranked, view.n_nodes))
        return np.stack(actions)

    return decide


def truth(env: MultiNodeEnv) -> np.ndarray:
    """Each task's true crossing, in observations from its start (inf: never)."""
    demand = true_demand(env.episode, env.curves).astype(np.float64)
    return np.where(demand > env.cap, np.inf, demand)


def training_demands(cfg: EnvConfig, episodes: int = 40, seed: int = 12345) -> np.ndarray:
    """True demands (inf: never reached) of tasks of `episodes` training episodes: the prior of a
    task with no forecast yet."""
    train = dataclasses.replace(cfg, split="train", predictor="wls")
    env = MultiNodeEnv(train)
    demands = []
    for i in range(episodes):
        env.reset(seed=seed + i)
        demands.append(truth(env))
    return np.concatenate(demands)


def sampled_worlds(env: MultiNodeEnv, fm: SampledPredictor, worlds: int, prior: np.ndarray,
                   rng: np.random.Generator) -> np.ndarray:
    """(W, tasks) crossings per world: FM's samples for the tasks present past warm-up, the prior
    for those in warm-up, the truth for the rest (tasks yet to arrive or already gone)."""
    out = np.tile(truth(env), (worlds, 1))
    live = np.flatnonzero((env.status == ACTIVE) | (env.status == WAITING))
    n = env.n_obs[live]
    forecast, fresh = live[n >= WARMUP_POINTS], live[n < WARMUP_POINTS]
    if len(forecast):
        rows, seen = env.task_rows[forecast], env.n_obs[forecast]
        hist = HistoryBatch.from_curves(env.curves.avg[rows], seen, env.curves.batch_size[rows], env.curves.lr[rows])
        horizon = (env.cap - seen).astype(np.float64)
        crossings = fm.sorted_crossings(hist, env.eps[forecast], horizon)
        crossings = np.where(crossings >= horizon[:, None], np.inf, np.maximum(crossings, 1.0))
        pick = rng.integers(0, crossings.shape[1], (worlds, len(forecast)))
        out[:, forecast] = seen + crossings[np.arange(len(forecast)), pick]
    if len(fresh):
        out[:, fresh] = env.n_obs[fresh] + np.maximum(rng.choice(prior, (worlds, len(fresh))), 1.0)
    return out


class World:
    """A copy of an env whose present tasks reach ε at the crossings `ends` (observations from
    their start); the teacher rolled out in it reads `frozen` forecasts (per task: median and
    optimistic crossing, in observations from the start) where given, else the world's demand.
    With `arrivals` off, the tasks still to arrive never do (the planner is not told them)."""

    def __init__(self, env: MultiNodeEnv, ends: np.ndarray, frozen: dict[int, tuple[float, float]],
                 arrivals: bool = True) -> None:
        self.env, self.ends, self.frozen = env.clone(), ends, frozen
        c = self.env
        if not arrivals:  # the world holds no task that arrives after the decision
            c.next_arrival = len(c.arrival)
        c.task_avg = c.task_avg.copy()
        present = np.flatnonzero((c.status == ACTIVE) | (c.status == WAITING))
        for k in present.tolist():
            n, row = int(c.n_obs[k]), c.task_avg[k]
            row[n:] = np.maximum(row[n:], c.eps[k] * (1 + 1e-9))
            if ends[k] <= c.cap:
                row[int(ends[k]) - 1] = c.eps[k] * (1 - 1e-9)
        self.forecast(present)

    def forecast(self, tasks: np.ndarray) -> None:
        c = self.env
        for k in tasks.tolist():
            left = self.ends[k] - c.n_obs[k]
            median, low = self.frozen.get(k, (self.ends[k], self.ends[k]))
            c.pred[k] = max(min(median - c.n_obs[k], c.cap - c.n_obs[k]), 1.0) if left > 0 else 0.0
            c.pred_low[k] = max(low - c.n_obs[k], 1.0) if np.isfinite(low) else np.inf

    def play(self, teacher: LARA, first: np.ndarray, dropped: set[int]) -> int:
        """Successes from here to the episode's end: `first`, then the teacher blind to `dropped`."""
        c, before, action = self.env, self.env.stats["successes"], first
        while True:
            _, done, _ = c.advance(action)
            self.forecast(np.concatenate([c.stale, c.slot_task[c.slot_task >= 0]]))
            c.stale = c.stale[:0]
            if done:
                return c.stats["successes"] - before
            action = teacher.act(view_without(c, dropped))


def rollout_decide(fm: SampledPredictor | None, worlds: int, alternatives: int | None, delta: float,
                   prior: np.ndarray, seed: int = 0, arrivals: bool = True,
                   persist_drops: bool = True, on_judged: Judged | None = None) -> BatchDecide:
    """The rollout planner of the module docstring; `fm` None: in the true world (hindsight);
    `arrivals` off: its worlds hold no later arrivals. `persist_drops` off: a drop holds for the
    decision it wins (and in that decision's rollouts) only, so no decision depends on an earlier
    one. `alternatives` None as well: every swap and drop is judged, so in the true world each
    decision is a function of the env's state alone, which a policy seeing no more than the env
    could copy; a count draws the candidates, and the choice depends on the draw too.
    `on_judged(env, action, options, gain)` sees each judged decision before it is taken: the
    teacher's action, the candidates and each one's mean gain over it."""
    teacher = ALLOCATORS[TEACHER]()
    rng = np.random.default_rng(seed)
    dropped: dict[tuple[int, int], set[int]] = {}

    def decide(obs, envs):
        actions = []
        for env in envs:
            gone = dropped.setdefault((id(env), env.resets), set())
            action = teacher.act(view_without(env, gone))
            waiting = [k for k in env.slot_task.tolist() if k >= 0 and k not in gone]
            if len(waiting) > (action > 0).sum():
                options = [(kind, x) for kind in KINDS for x in candidates(kind, action, env, alternatives, rng)]
                firsts = [action] + [x if kind == "swap" else teacher.act(view_without(env, gone | {x}))
                                     for kind, x in options]
                if fm is None:
                    ends, frozen = truth(env)[None], {}
                else:
                    ends = sampled_worlds(env, fm, worlds, prior, rng)
                    frozen = {k: (env.pred[k] + env.n_obs[k], env.pred_low[k] + env.n_obs[k])
                              for k in np.flatnonzero(env.n_obs >= WARMUP_POINTS).tolist()}
                scores = np.array([[World(env, w, frozen, arrivals).play(teacher, first, gone | {x} if kind == "drop" else gone)
                                    for first, (kind, x) in zip(firsts, [("keep", None), *options], strict=True)]
                                   for w in ends], np.float64)
                gain = scores[:, 1:] - scores[:, :1]
                mean, error = gain.mean(0), gain.std(0) / np.sqrt(len(gain))
                if on_judged is not None:
                    on_judged(env, action, options, mean)
                better = (mean >= delta) & (mean > 2 * error) if len(gain) > 1 else mean > 0
                if better.any():
                    best = int(np.argmax(np.where(better, mean, -np.inf)))
                    action = firsts[best + 1]
                    if options[best][0] == "drop" and persist_drops:
                        gone.add(options[best][1])
            actions.append(action)
        return np.stack(actions)

    return decide


def told_search(alternatives: int | None, seed: int, persist_drops: bool = False,
                on_judged: Judged | None = None) -> BatchDecide:
    """The rollout planner in the one true world with no later arrivals (`--planners hindsight
    --no-arrivals-ahead`): in an env told the exact demand, one step of policy iteration over the
    told teacher that uses nothing it does not see. (One world: any gain above 0 decides.)"""
    return rollout_decide(None, 1, alternatives, 0.0, np.zeros(0), seed=seed, arrivals=False,
                          persist_drops=persist_drops, on_judged=on_judged)


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True, roots=True)
    parser.add_argument("--worlds", type=int, default=16)
    parser.add_argument("--loads", default="0.04")
    parser.add_argument("--planners", default="served,kept", help=f"of {', '.join(PLANNERS)}, comma-separated")
    parser.add_argument("--hold", type=int, default=10, help="the rollout planners' decision interval")
    add_alternatives_flag(parser)
    parser.add_argument("--delta", type=float, default=0.25, help="least mean gain (successes) to deviate")
    parser.add_argument("--exact", action="store_true",
                        help="every row reads the true demand (the oracle predictor); planners: hindsight only")
    parser.add_argument("--arrivals-ahead", action=argparse.BooleanOptionalAction, default=True,
                        help="the rollout worlds hold the episode's later arrivals (off: none)")
    parser.add_argument("--recall", action="store_true",
                        help="read the recall predictor instead of FM (planners: rollout, hindsight)")
    parser.add_argument("--persist-drops", action=argparse.BooleanOptionalAction, default=True,
                        help="a task the rollout planners drop stays dropped (off: for that decision only)")
    args = parser.parse_args(argv)
    planners = comma_list(args.planners, "--planners")
    if not planners or set(planners) - set(PLANNERS):
        parser.error(f"--planners: choose from {list(PLANNERS)}")
    if args.exact and set(planners) != {"hindsight"}:
        parser.error("--exact: the other planners read FM's samples; give --planners hindsight")
    if args.recall and set(planners) & {"served", "kept"}:
        parser.error("--recall: the served and kept planners read FM's kept samples; give rollout, hindsight")
    profile = Profile.load(args.profile)
    fm_dir = args.fm or profile.paths.predictor
    # With --exact nothing reads FM (hindsight plans in the true world): it is not loaded.
    fm: SampledPredictor | None = (None if args.exact else RecallPredictor.load(fm_dir) if args.recall
                                   else SampleKeepingFM(FMPredictor.load(fm_dir)))
    source = "oracle" if args.exact else fm
    worlds = "the true world" if args.exact else f"{args.worlds} worlds"
    forecasts = "exact (the oracle predictor)" if args.exact else "recall" if args.recall else "FM"
    lines = [f"Profile {profile.name}; forecasts {forecasts}; rollout "
             f"planners decide at events (H = {args.hold}), {worlds}, {args.alternatives or 'all'} swaps and "
             f"drops, δ = {args.delta}, later arrivals {'in' if args.arrivals_ahead else 'not in'} the worlds, "
             f"drops {'held to the end' if args.persist_drops else 'for one decision'}.", "",
             "| load | teacher | llf | teacher held | " + " | ".join(planners) + " |",
             "|---|---|---|---|" + "---|" * len(planners)]
    with torch_threads(1):
        for load in comma_list(args.loads, "--loads", float):
            cfg = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), split="val",
                                  task_set="id", arrival_prob=load)
            held = dataclasses.replace(cfg, decision_interval=args.hold)
            episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
            row = [success(cfg, episodes, source), success(cfg, episodes, source, "llf"),
                   success(held, episodes, source)]
            prior = training_demands(cfg) if {"rollout", "hindsight"} & set(planners) else np.zeros(0)
            for planner in planners:
                if planner in ("served", "kept"):
                    env, decide = cfg, worlds_decide(fm, args.worlds, planner)
                else:
                    env, decide = held, rollout_decide(fm if planner == "rollout" else None, args.worlds,
                                                       args.alternatives, args.delta, prior,
                                                       arrivals=args.arrivals_ahead,
                                                       persist_drops=args.persist_drops)
                outs = replay_in_lockstep(dataclasses.replace(env, predictor=source), episodes, decide)
                row.append(100 * float(np.mean([o["success_rate"] for o in outs])))
                print(f"[worlds] load {load} {planner}: {row[-1]:.2f}", flush=True)
            lines.append(f"| {load} | " + " | ".join(f"{r:.2f}" for r in row) + " |")
            print(lines[-1], flush=True)
    return save_table(lines, args.out, table_name("worlds_probe", profile, "_recall" if args.recall else ""))


if __name__ == "__main__":
    main()
