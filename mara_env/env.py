"""The multi-node scheduling simulator (docs/design.md §3–§4) as a Gymnasium env.

Time is discrete. In one step each of N identical nodes serves at most one
active task for one optimisation batch, which reveals one more point of that
task's real loss curve. `reset` performs the arrivals of step 0; `step(a)`
applies the joint action of step t, then the arrivals of step t+1, so the
observation an agent sees is always taken just after arrivals (docs/design.md §3).
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from mara_common.config import ConfigError, check_config, setting
from mara_common.paths import ProjectPaths
from mara_env.cluster import ClusterConfig, node_batches
from mara_env.registry import ALLOCATORS
from mara_env.slot_view import SlotView
from mara_env.workload import (
    BurstConfig,
    Episode,
    WorkloadConfig,
    add_burst,
    curve_rows,
    family_reference,
    sample_episode,
    true_demand,
)
from mara_fm.bank import SPLITS, CurveSet, load_bank, select
from mara_fm.predictors import WARMUP_POINTS, Predictor, make_predictor

DEFAULT_BANK = ProjectPaths("default").bank

PENDING, ACTIVE, WAITING, SUCCEEDED, EXPIRED, REJECTED = range(6)
# The step-info counts a held decision sums over its steps (the others are the last step's).
HELD_COUNTS = ("successes", "expirations", "rejections")
BASE_SLOT_FEATURES = 4  # present, predicted remaining, time to deadline, warm-up fraction
# The EnvConfig options that add slot features or change when allocators decide: a policy runs
# in an env with the values it was trained with, and each evaluated method names its own.
VIEW_OPTIONS = ("optimistic_quantile", "probe_points", "decision_interval", "trend_window", "rule_hint")
# With `EnvConfig.cluster` enabled: per slot, the restore cost r_k and the restore steps left
# (each / restore_hi) and the speed of the node that served it at the last step (/ the fastest;
# 0: none), so every node can see which tasks another node holds; per node, its speed / the
# fastest speed and whether it is restoring.
CLUSTER_SLOT_FEATURES = 3
NODE_FEATURES = 2
# With `EnvConfig.trend_window`: per slot, the task's progress q (docs/design.md §4) and the
# progress it would reach by its deadline if its recent trend held (/ 2, capped at 1).
TREND_SLOT_FEATURES = 2
# With `EnvConfig.critic_features` (training only): per slot, the task's true remaining
# batches / cap and whether the fastest node could still finish it by its deadline; globally,
# the true demand arriving in the next 25, 50, 100 and 200 steps and that of the waiting queue,
# each in node-steps of the window (/ N·W; the queue's over 100 steps), capped at 1.
CRITIC_SLOT_FEATURES = 2
CRITIC_WINDOWS = (25, 50, 100, 200)
CRITIC_GLOBALS = len(CRITIC_WINDOWS) + 1


@dataclass
class EnvConfig:
    n_nodes: int = setting(7, ge=1, help="nodes N, each serving one task per step")
    n_slots: int = setting(16, ge=1, help="active slots K")
    queue_size: int = setting(8, ge=0, help="waiting queue Q (0: arrivals with no free slot are rejected)")
    horizon: int = setting(500, ge=1, help="steps T per episode")
    arrival_prob: float = setting(0.04, ge=0.0, le=1.0, help="probability of an arrival at each step")
    # An addition to the paper, for training: each sampled episode draws its arrival
    # probability uniformly from [arrival_prob, arrival_prob_max], so a policy meets the
    # heavier loads of the sweep. Episodes passed in (the frozen evaluation sets) keep theirs.
    arrival_prob_max: float | None = setting(None, ge=0.0, le=1.0,
                                             help="draw each sampled episode's arrival probability "
                                             "up to this (unset: arrival_prob)")
    task_set: str = setting("id", help="the bank's task set: id, rl_ood or vit_ood")
    split: str = setting("train", choices=SPLITS, help="the bank's split")
    predictor: str | Predictor = "wls"
    beta: float = setting(0.1, ge=0.0, help="weight β of the progress shaping")
    bank: str = setting("", help="bank file (empty: data/banks/default.parquet)")
    strict: bool = setting(False, help="raise on an empty or already taken pick instead of idling the node")
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    # Share of sampled episodes that also carry an overload burst (a randomised stress
    # pattern, see `BurstConfig`); for training. Frozen evaluation episodes never do.
    burst_prob: float = setting(0.0, ge=0.0, le=1.0, help="share of sampled episodes with an overload burst")
    burst: BurstConfig = field(default_factory=BurstConfig)
    # An addition to docs/design.md §3: with q set, each slot also shows the predictor's
    # optimistic estimate, the q-quantile of its own spread (FM: an order statistic
    # of its M sampled crossings; WLS and the oracle: the estimate itself; inf, shown
    # as 1, when it does not reach the threshold within the task's generation cap),
    # and allocators see it as `SlotView.optimistic`. None: the four features of docs/design.md §3.
    optimistic_quantile: float | None = setting(None, ge=0.0, le=0.5,
                                                help="show the predictor's optimistic estimate at this quantile")
    # An addition to docs/design.md §3: observations a task gets before its forecast may count
    # against it. Allocators that read it (`lara_optimistic`, `llf`) serve tasks with fewer
    # first, as LARA does tasks in the predictor's 4-point warm-up: a forecast from 4
    # points cannot see a plateau that breaks later. With it set each slot also shows
    # min(observed, probe_points) / probe_points, so the MAT can tell those tasks apart.
    # None: no such feature, and those allocators judge after the warm-up.
    probe_points: int | None = setting(None, ge=WARMUP_POINTS,
                                       help="observations before a task's forecast counts (>= the warm-up)")
    # An addition to the paper: decisions at events (docs/design.md §3, Step order). A joint action
    # is held for up to this many steps, and the scheduler decides again as soon as the
    # population or a task's standing changes: an arrival, a success, an expiry, a served task
    # reaching its warm-up or probe point. One env step is then one decision. None: a
    # decision every step, as in the paper.
    decision_interval: int | None = setting(None, ge=1,
                                            help="hold each joint action up to N steps, until an event")
    # An addition to the paper (docs/design.md §3, Observation): two more slot features read off
    # the task's own loss prefix, which no rule reads: its progress q toward ε in log-loss, and
    # where q would stand at the deadline if the slope of q over the last W observations held
    # (every remaining step served, on the fastest node). A forecast that calls a flat curve
    # reachable, or a falling one hopeless, can be told apart from one its trend agrees with.
    trend_window: int | None = setting(None, ge=2, help="show each task's progress and its trend over "
                                       "the last W observations projected to the deadline")
    # An addition to the paper (docs/design.md §7, "Rule hint"): the observation also carries the
    # joint action this allocator (a name of `mara_env.registry.ALLOCATORS`) would take now, as
    # `rule_action` (N,), and the MAT adds a learned bonus to each node's logit for it: a
    # residual policy that starts at the rule and learns where to leave it. None: not shown.
    rule_hint: str | None = setting(None, help="also show the joint action this allocator would take")
    # Node speeds and restore costs (docs/design.md §10; `mara_env.cluster`). Off by default.
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    # An addition to the paper (docs/design.md §7, "Privileged critic"): the observation also carries what the
    # simulator knows and no scheduler may, `critic_slots` and `critic_globals` (each task's
    # true remaining demand, the demand still to arrive), for a value function that reads
    # them in training. The policy never reads them; a live run cannot show them.
    critic_features: bool = setting(False, help="also show the value function the true demand "
                                    "of every task and of the arrivals to come (training only)")

    def __post_init__(self) -> None:
        """Every count, share and range checked here, naming the field (ConfigError, a ValueError);
        `workload` and `burst` may be given as dicts of their settings."""
        check_config(self)
        if self.arrival_prob_max is not None and self.arrival_prob_max < self.arrival_prob:
            raise ConfigError(f"EnvConfig.arrival_prob_max: {self.arrival_prob_max} is below "
                              f"arrival_prob {self.arrival_prob}")
        if self.rule_hint is not None and self.rule_hint not in ALLOCATORS:
            raise ConfigError(f"EnvConfig.rule_hint: unknown allocator {self.rule_hint!r}; "
                              f"known: {sorted(ALLOCATORS)}")

    @classmethod
    def from_overrides(cls, **overrides: Any) -> EnvConfig:
        """A config from keyword overrides, naming any unknown option."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown MultiNodeEnv option(s) {unknown}; known: {sorted(known)}")
        return cls(**overrides)

    @property
    def bank_path(self) -> Path:
        return Path(self.bank) if self.bank else DEFAULT_BANK

    @property
    def view_options(self) -> dict[str, Any]:
        """This config's `VIEW_OPTIONS` and their values."""
        return {name: getattr(self, name) for name in VIEW_OPTIONS}

    @property
    def slot_features(self) -> int:
        return (BASE_SLOT_FEATURES + (self.optimistic_quantile is not None) + (self.probe_points is not None)
                + CLUSTER_SLOT_FEATURES * self.cluster.enabled + TREND_SLOT_FEATURES * (self.trend_window is not None))

    @property
    def fastest(self) -> float:
        """The fastest node's speed (1 on identical nodes): the Oracle bound's node."""
        return float(self.cluster.speeds(self.n_nodes).max())

    @property
    def node_features(self) -> int:
        """Per-node observation features (0: the observation has no node part)."""
        return NODE_FEATURES * self.cluster.enabled

    def spaces(self) -> tuple[spaces.Dict, spaces.MultiDiscrete]:
        """This config's observation and action spaces."""
        return make_spaces(self.n_nodes, self.n_slots, self.slot_features, self.node_features,
                           self.critic_features, self.rule_hint is not None)


@functools.lru_cache(maxsize=16)
def _curves(bank: str, mtime: float, task_set: str, split: str) -> CurveSet:
    return select(load_bank(bank), task_set, split)


def load_curves(bank: str | Path, task_set: str, split: str) -> CurveSet:
    """A curve set of a bank file (cached per file version, so envs share its derived arrays)."""
    path = Path(bank)
    if not path.exists():
        raise FileNotFoundError(f"{path}: bank file not found (build one with `mara curves`)")
    return _curves(str(path), path.stat().st_mtime, task_set, split)


def make_spaces(n_nodes: int, n_slots: int, slot_features: int = BASE_SLOT_FEATURES, node_features: int = 0,
                critic: bool = False, rule_hint: bool = False) -> tuple[spaces.Dict, spaces.MultiDiscrete]:
    """Observation and action spaces of an env with N nodes, K slots and F features per slot;
    with node features, also `nodes` (N, F_node) and `node_last` (N,): the slot each node
    served at the last step, as an action (0: none, or that task has left); with `critic`,
    also `critic_slots` (K, 2) and `critic_globals` (5,); with `rule_hint`, also `rule_action` (N,):
    an allocator's joint action for this state."""
    parts = {
        "slots": spaces.Box(0.0, 1.0, (n_slots, slot_features), np.float32),
        "globals": spaces.Box(0.0, 1.0, (4,), np.float32),
        "slot_mask": spaces.Box(0, 1, (n_slots,), np.int8),
    }
    if node_features:
        parts["nodes"] = spaces.Box(0.0, 1.0, (n_nodes, node_features), np.float32)
        parts["node_last"] = spaces.Box(0, n_slots, (n_nodes,), np.int64)
    if critic:
        parts["critic_slots"] = spaces.Box(0.0, 1.0, (n_slots, CRITIC_SLOT_FEATURES), np.float32)
        parts["critic_globals"] = spaces.Box(0.0, 1.0, (CRITIC_GLOBALS,), np.float32)
    if rule_hint:
        parts["rule_action"] = spaces.Box(0, n_slots, (n_nodes,), np.int64)
    return spaces.Dict(parts), spaces.MultiDiscrete(np.full(n_nodes, n_slots + 1, dtype=np.int64))


def progress_terms(log_first: np.ndarray, log_eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-task constants of q_k (docs/design.md §4): q = clip((log L_0 − log L)·scale + offset, 0, 1).

    scale = 1 / log(L_0/ε) and offset 0, or — when the first loss already
    meets ε — scale 0 and offset 1, so that q = 1.
    """
    span = log_first - log_eps
    reached = span <= 0
    return np.where(reached, 0.0, 1.0 / np.where(reached, 1.0, span)), reached.astype(np.float64)


class MultiNodeEnv(gym.Env):
    """N nodes, K active slots, a waiting queue of Q, horizon T.

    Action: `MultiDiscrete([K+1]*N)`, per node 0 = idle, j = slot j−1.
    Observation: per-slot features [present, predicted remaining batches / cap,
    time to deadline / cap, warm-up fraction, (optimistic remaining / cap, with
    `optimistic_quantile`), (observed / probe_points, capped at 1, with
    `probe_points`)], globals [busy nodes / N, active / K, waiting / Q, t / T]
    and the slot mask. The elapsed-time feature is an
    addition to docs/design.md §3: with γ = 1 and a fixed horizon the value of a state
    depends on the time left, which the counts alone do not reveal.
    Reward: successes + β·(Φ_{t+1} − Φ_t); the shaped return equals the
    number of successes exactly, because Φ is 0 at both ends.
    `reset(options={"episode": Episode})` replays a frozen episode.
    """

    metadata = {"render_modes": []}

    def __init__(self, config: EnvConfig | None = None, curves: CurveSet | None = None, **overrides: Any) -> None:
        """`curves`: the curve set to replay instead of the config's bank split (a live run
        passes curves that grow as its jobs train, `mara_live.curves`)."""
        self.cfg = config = config or EnvConfig.from_overrides(**overrides)
        self.curves = curves if curves is not None else load_curves(config.bank_path, config.task_set, config.split)
        wl = config.workload
        self.reference = (family_reference(self.curves, wl.eps_quantile)
                          if wl.threshold_source == "family" else None)
        self.predictor = make_predictor(config.predictor)
        self.cap = self.curves.cap
        self.observation_space, self.action_space = config.spaces()
        self.speeds = config.cluster.speeds(config.n_nodes)
        self.relative_speeds = self.speeds / self.speeds.max()  # as the observation shows them
        self.episode: Episode | None = None
        self.resets = 0  # with id(self), names the episode to allocators that keep state
        self.hint_rule = ALLOCATORS[config.rule_hint]() if config.rule_hint is not None else None

    # ------------------------------------------------------------------ episode

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        episode = (options or {}).get("episode")
        if episode is None:
            load = self.cfg.arrival_prob
            if self.cfg.arrival_prob_max is not None:
                load = self.np_random.uniform(load, self.cfg.arrival_prob_max)
            episode = sample_episode(self.curves, self.cfg.horizon, load,
                                     self.cfg.workload, self.np_random, self.reference)
            if self.cfg.burst_prob > 0 and self.np_random.random() < self.cfg.burst_prob:
                episode = add_burst(episode, self.curves, self.cfg.burst, self.np_random)
        if episode.horizon != self.cfg.horizon:
            raise ValueError(f"episode horizon {episode.horizon} != env horizon {self.cfg.horizon}")
        self.episode = episode
        self.resets += 1
        rows = curve_rows(episode, self.curves)
        m = len(episode)
        self.task_rows = rows
        self.task_avg = self.curves.avg[rows]
        self.task_log_avg = self.curves.log_avg[rows]
        self.arrival = episode.arrival
        self.deadline = episode.deadline
        if np.any(self.deadline - self.arrival > self.cap):
            raise ValueError(f"a task window exceeds the curve cap {self.cap}")
        self.eps = episode.eps
        if self.cfg.critic_features:
            self._plan_critic_view(episode)
        self.log_first = self.task_log_avg[:, 0]
        self.q_scale, self.q_offset = progress_terms(self.log_first, np.log(self.eps))
        self.n_obs = np.zeros(m, np.int64)
        self.status = np.full(m, PENDING, np.int8)
        self.pred = np.full(m, float(self.cap))
        self.pred_low = np.full(m, float(self.cap))  # the optimistic estimate, if the env shows one
        self.ready_step = np.full(m, -1, np.int64)
        self.q = np.zeros(m)  # progress q_k, 0 until the first observation
        self.trend = np.zeros(m)  # slope of q per batch over the last `trend_window` observations
        # Per-task slot features; only a served task's change, plus the clock (column 2).
        own = (self.cfg.slot_features - CLUSTER_SLOT_FEATURES * self.cfg.cluster.enabled  # the rest: observation()
               - TREND_SLOT_FEATURES * (self.cfg.trend_window is not None))
        self.task_feat = np.zeros((m, own), np.float32)
        self.task_feat[:, 0] = 1.0
        self.task_feat[:, 1] = 1.0  # the remaining cap, normalised
        self.task_feat[:, 2] = self.deadline / self.cap
        if self.cfg.optimistic_quantile is not None:
            self.task_feat[:, BASE_SLOT_FEATURES] = 1.0  # the optimistic estimate starts at the cap too
        # Each node's task at the last step (-1: none) and whether it was restoring then; cluster
        # state: each task's restore cost, restore steps left, and the node and step that
        # served it last (-1: never).
        self.node_task = np.full(self.cfg.n_nodes, -1, np.int64)
        self.node_restoring = np.zeros(self.cfg.n_nodes, bool)
        self.restore_cost = self.cfg.cluster.restore_costs(list(episode.curve_ids), episode.arrival)
        self.restore_left = np.zeros(m, np.int64)
        self.last_node = np.full(m, -1, np.int64)
        self.last_step = np.full(m, -1, np.int64)
        self.slot_task = np.full(self.cfg.n_slots, -1, np.int64)
        self.queue: deque[int] = deque()
        self.next_arrival = 0
        self.t = 0
        self.busy = 0
        self.stats = {"successes": 0, "expirations": 0, "rejections": 0, "invalid_actions": 0,
                      "busy_node_steps": 0, "full_queue_steps": 0, "waiting_sum": 0}
        rejected = self._arrivals()
        self._record_decision_point()
        self.potential = 0.0
        self.stale = np.zeros(0, np.int64)
        self.event = False
        return self.observation(), self._step_info(0, 0, rejected, 0)

    def _plan_critic_view(self, episode: Episode) -> None:
        """What `critic_features` shows, fixed per episode: each task's true demand from its
        first batch (the cap when it never reaches ε) and the demand arriving by each step."""
        demand = true_demand(episode, self.curves)  # cap + 1: never reaches ε
        self.reaches = demand <= self.cap
        self.true_demand = np.minimum(demand, self.cap)
        arriving = np.bincount(self.arrival, weights=self.true_demand, minlength=self.cfg.horizon + 1)
        self.demand_by_step = np.concatenate([[0.0], np.cumsum(arriving)])  # [s]: arrivals before step s

    def critic_view(self) -> dict[str, np.ndarray]:
        """`critic_slots` and `critic_globals` (`EnvConfig.critic_features`) as they stand now."""
        k, n, t = self.cfg.n_slots, self.cfg.n_nodes, self.t
        mask = self.slot_task >= 0
        tasks = self.slot_task[mask]
        left = self.true_demand[tasks] - self.n_obs[tasks]
        slots = np.zeros((k, CRITIC_SLOT_FEATURES), np.float32)
        slots[mask, 0] = np.minimum(left / self.cap, 1.0)
        slots[mask, 1] = self.reaches[tasks] & (left <= self.cfg.fastest * (self.deadline[tasks] - t))
        last = len(self.demand_by_step) - 1
        ahead = [(self.demand_by_step[min(t + 1 + w, last)] - self.demand_by_step[min(t + 1, last)]) / (n * w)
                 for w in CRITIC_WINDOWS]
        waiting = self.true_demand[list(self.queue)].sum() / (n * 100) if self.queue else 0.0
        glob = np.minimum(np.array([*ahead, waiting], np.float32), 1.0)
        return {"critic_slots": slots, "critic_globals": glob}

    def clone(self) -> MultiNodeEnv:
        """An independent copy of this env as it stands mid-episode, to play a rollout from; it
        shares what an episode never changes (config, curves, predictor, episode)."""
        shared = (self.cfg, self.curves, self.predictor, self.reference, self.episode, self.np_random,
                  self.observation_space, self.action_space, self.task_avg, self.task_log_avg)
        return copy.deepcopy(self, {id(x): x for x in shared})

    def _arrivals(self) -> int:
        rejected = 0
        while self.next_arrival < len(self.arrival) and self.arrival[self.next_arrival] == self.t:
            k = self.next_arrival
            self.next_arrival += 1
            free = np.flatnonzero(self.slot_task < 0)
            if len(free):
                self.slot_task[free[0]] = k
                self.status[k] = ACTIVE
            elif len(self.queue) < self.cfg.queue_size:
                self.queue.append(k)
                self.status[k] = WAITING
            else:
                self.status[k] = REJECTED
                rejected += 1
        self.stats["rejections"] += rejected
        return rejected

    # ------------------------------------------------------------------ step

    def step(self, action):
        reward, terminated, info = self.advance(action)
        query = self.prediction_query()
        if len(query[0]):
            self.store_predictions(self.predictor.replay_remaining(self.curves, *query,
                                                                   self.cfg.optimistic_quantile))
        return self.observation(), reward, terminated, False, info

    def advance(self, action) -> tuple[float, bool, dict]:
        """One decision except the prediction refresh: (reward, terminated, info).

        A decision is one step, or with `decision_interval` the steps until the next event
        (rewards and counts summed over them). The tasks whose history grew are left in
        `prediction_query()`, so that a vector env can answer the queries of all its envs
        in one predictor call.
        """
        if self.episode is None:
            raise RuntimeError("call reset() before step()")
        action = np.asarray(action)
        reward, terminated, info = self._advance_step(action)
        for _ in range(1, self.cfg.decision_interval or 1):
            if terminated or self.event:
                break
            more, terminated, later = self._advance_step(action)
            reward += more
            info = {**later, **{k: info[k] + later[k] for k in HELD_COUNTS}}
        return reward, terminated, info

    def _advance_step(self, action: np.ndarray) -> tuple[float, bool, dict]:
        """One step of the simulator; `self.event` says whether the scheduler should decide again."""
        unanswered = self.stale  # tasks whose history grew since the predictor last answered
        served, nodes = self._served_tasks(action)
        self.busy = len(served)
        self.node_task[:] = -1
        self.node_task[nodes] = served
        succeeded = np.zeros(0, np.int64)
        self.event = False
        if self.cfg.cluster.enabled:
            served = self._serve_on_cluster(served, nodes)  # those that progress, with their batches
        else:
            self.batches = np.ones(len(served), np.int64)
        if len(served):
            old = self.n_obs[served]
            self.reveal(served, np.minimum(old + self.batches, self.cap))
            n = old.copy()
            hit = np.zeros(len(served), bool)
            for j in range(int(self.batches.max())):  # one revealed point at a time, up to the cap
                going = ~hit & (self.batches > j) & (n < self.cap)
                n = n + going
                hit |= going & (self.task_avg[served, np.maximum(n - 1, 0)] <= self.eps[served])
            self.n_obs[served] = n
            judged = (old < WARMUP_POINTS) & (n >= WARMUP_POINTS)
            if self.cfg.probe_points is not None:
                judged |= (old < self.cfg.probe_points) & (n >= self.cfg.probe_points)
            self.event = bool(judged.any())
            ready = served[(old < WARMUP_POINTS) & (n >= WARMUP_POINTS)]
            self.ready_step[ready] = self.t + 1 - self.arrival[ready]
            latest = (served, np.maximum(n - 1, 0))
            q = (self.log_first[served] - self.task_log_avg[latest]) * self.q_scale[served] + self.q_offset[served]
            self.q[served] = np.minimum(np.maximum(q, 0.0), 1.0)
            if self.cfg.trend_window is not None:
                back = np.maximum(n - 1 - self.cfg.trend_window, 0)
                earlier = (self.log_first[served] - self.task_log_avg[served, back]) * self.q_scale[served]
                self.trend[served] = (q - self.q_offset[served] - earlier) / np.maximum(n - 1 - back, 1)
            succeeded = served[hit]
            self.status[succeeded] = SUCCEEDED
            served = served[n > old]  # a task at its curve's cap reveals nothing new
        expired = self._remove_finished()
        # Finished tasks need no prediction; those still waiting for one from earlier steps of a
        # held decision keep their place ahead of this step's.
        self.stale = served[self.status[served] == ACTIVE]
        if len(earlier := unanswered):
            earlier = earlier[(self.status[earlier] == ACTIVE) & ~np.isin(earlier, served)]
            self.stale = np.concatenate([earlier, self.stale])

        n_success = len(succeeded)
        self.stats["successes"] += n_success
        self.stats["expirations"] += expired
        self.stats["busy_node_steps"] += self.busy
        active = self.slot_task[self.slot_task >= 0]
        new_potential = float(self.q[active].sum())
        reward = n_success + self.cfg.beta * (new_potential - self.potential)
        self.potential = new_potential

        self.t += 1
        terminated = self.t >= self.cfg.horizon
        rejected = 0
        if terminated:
            assert not (self.slot_task >= 0).any() and not self.queue, (
                "tasks left at the horizon: every deadline must be <= T"
            )
        else:
            arrived = self.next_arrival
            rejected = self._arrivals()
            self.event |= self.next_arrival > arrived
            self._record_decision_point()
        self.event |= n_success > 0 or expired > 0
        info = self._step_info(n_success, expired, rejected, self.busy)
        if terminated:
            info.update(self.episode_summary())
        return float(reward), terminated, info

    def reveal(self, tasks: np.ndarray, upto: np.ndarray) -> None:
        """Make the first upto[i] points of task tasks[i]'s curve known before they are read.
        A bank's curves are known in full; a live env trains its jobs here."""

    def _remove_finished(self) -> int:
        """Drop succeeded tasks and expire those past their last step; refill from the queue."""
        expired = 0
        last_step = self.t + 1
        for s, k in enumerate(self.slot_task.tolist()):  # plain ints: faster than numpy scalars
            if k < 0:
                continue
            if self.status[k] == SUCCEEDED:
                self.slot_task[s] = -1
            elif last_step >= self.deadline[k]:
                self.status[k] = EXPIRED
                self.slot_task[s] = -1
                expired += 1
        if self.queue:
            for k in [k for k in self.queue if last_step >= self.deadline[k]]:
                self.queue.remove(k)
                self.status[k] = EXPIRED
                expired += 1
            for s in np.flatnonzero(self.slot_task < 0).tolist():
                if not self.queue:
                    break
                k = self.queue.popleft()
                self.slot_task[s] = k
                self.status[k] = ACTIVE
        return expired

    def _serve_on_cluster(self, served: np.ndarray, nodes: np.ndarray) -> np.ndarray:
        """Apply restores and node speeds (`mara_env.cluster`): the served tasks that make
        progress this step, with their batch counts left in `self.batches`."""
        t = self.t
        kept = (self.last_node[served] == nodes) & (self.last_step[served] == t - 1)
        resumed = (self.last_node[served] >= 0) & ~kept
        self.restore_left[served[resumed]] = self.restore_cost[served[resumed]]
        restoring = self.restore_left[served] > 0
        self.restore_left[served[restoring]] -= 1
        self.last_node[served], self.last_step[served] = nodes, t
        self.node_restoring[:] = False
        self.node_restoring[nodes[restoring]] = True
        batches = node_batches(self.speeds, t)[nodes]
        going = ~restoring & (batches > 0)
        self.batches = batches[going]
        return served[going]

    def _served_tasks(self, action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tasks a joint action serves, and the nodes serving them. An action outside the
        action space (not N integers in [0, K]) raises ValueError even when not strict; a pick
        of an empty slot or of one an earlier node took idles the node (strict: ValueError)."""
        picks = action.reshape(-1)
        if picks.shape != (self.cfg.n_nodes,):
            raise ValueError(self._action_error(f"got shape {action.shape}"))
        if picks.dtype.kind not in "iu":
            raise ValueError(self._action_error(f"got dtype {picks.dtype}"))
        picks = picks.tolist()
        if min(picks) < 0 or max(picks) > self.cfg.n_slots:
            node = next(i for i, p in enumerate(picks) if not 0 <= p <= self.cfg.n_slots)
            raise ValueError(self._action_error(f"got node {node} -> {picks[node]}"))
        slot_task = self.slot_task.tolist()
        taken: set[int] = set()
        served, nodes = [], []
        for node, pick in enumerate(picks):
            if pick == 0:
                continue
            slot = pick - 1
            problem = None
            if slot_task[slot] < 0:
                problem = "is empty"
            elif slot in taken:
                problem = "was already taken by an earlier node"
            if problem:
                if self.cfg.strict:
                    raise ValueError(f"invalid joint action: node {node} picked slot {slot}, which {problem}")
                self.stats["invalid_actions"] += 1
                continue
            taken.add(slot)
            served.append(slot_task[slot])
            nodes.append(node)
        return np.asarray(served, np.int64), np.asarray(nodes, np.int64)

    def _action_error(self, got: str) -> str:
        n, k = self.cfg.n_nodes, self.cfg.n_slots
        return (f"a joint action is {n} integers in [0, {k}], one per node (N={n} nodes, K={k} slots; "
                f"0 idles a node, j serves slot j-1); {got}")

    def prediction_query(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(curve rows, observed points, ε, horizon) of the tasks whose history grew."""
        n = self.n_obs[self.stale]
        return self.task_rows[self.stale], n, self.eps[self.stale], (self.cap - n).astype(np.float64)

    def store_predictions(self, remaining: np.ndarray) -> None:
        """Take the predictor's answers to `prediction_query()`: (n,), or (n, 2) with the
        optimistic estimate when the env shows it."""
        tasks, self.stale = self.stale, self.stale[:0]
        if remaining.ndim == 2:
            remaining, low = remaining[:, 0], remaining[:, 1]
            self.pred_low[tasks] = low
            self.task_feat[tasks, BASE_SLOT_FEATURES] = np.minimum(low / self.cap, 1.0)
        self.pred[tasks] = remaining
        self.task_feat[tasks, 1] = np.minimum(remaining / self.cap, 1.0)
        self.task_feat[tasks, 3] = np.minimum(self.n_obs[tasks], WARMUP_POINTS) / WARMUP_POINTS
        if self.cfg.probe_points is not None:  # the last column
            self.task_feat[tasks, -1] = np.minimum(self.n_obs[tasks], self.cfg.probe_points) / self.cfg.probe_points

    # ------------------------------------------------------------------ views

    def observation(self) -> dict[str, np.ndarray]:
        k = self.cfg.n_slots
        mask = self.slot_task >= 0
        tasks = self.slot_task[mask]
        feat = self.task_feat[tasks]
        feat[:, 2] = np.maximum(feat[:, 2] - self.t / self.cap, 0.0)  # time to deadline, <= 1 already
        if self.cfg.cluster.enabled:
            scale = max(self.cfg.cluster.restore_hi, 1)
            holder_speed = dict(zip(self.node_task.tolist(), self.relative_speeds.tolist(), strict=True))
            held = np.array([holder_speed.get(k, 0.0) for k in tasks.tolist()], np.float32)
            feat = np.concatenate([feat, np.stack([self.restore_cost[tasks], self.restore_left[tasks]], 1)
                                   .astype(np.float32) / scale, held[:, None]], axis=1)
        if self.cfg.trend_window is not None:
            steps = np.minimum(np.maximum(self.deadline[tasks] - self.t, 0) * self.cfg.fastest,
                               self.cap - self.n_obs[tasks])
            projected = np.clip(self.q[tasks] + self.trend[tasks] * steps, 0.0, 2.0) / 2
            feat = np.concatenate([feat, np.stack([self.q[tasks], projected], 1).astype(np.float32)], axis=1)
        slots = np.zeros((k, self.cfg.slot_features), np.float32)
        slots[mask] = feat
        glob = np.array([self.busy / self.cfg.n_nodes, len(tasks) / k,
                         len(self.queue) / max(self.cfg.queue_size, 1),
                         min(self.t / self.cfg.horizon, 1.0)], np.float32)
        obs = {"slots": slots, "globals": glob, "slot_mask": mask.astype(np.int8)}
        if self.cfg.cluster.enabled:
            held = self.node_task >= 0
            restoring = np.zeros(self.cfg.n_nodes, np.float32)
            restoring[held] = self.restore_left[self.node_task[held]] > 0
            obs["nodes"] = np.stack([self.relative_speeds, restoring], 1).astype(np.float32)
            obs["node_last"] = self.node_slots() + 1
        if self.cfg.critic_features:
            obs.update(self.critic_view())
        if self.hint_rule is not None:
            obs["rule_action"] = np.asarray(self.hint_rule.act(self.scheduler_view()), np.int64)
        return obs

    def node_slots(self) -> np.ndarray:
        """The slot each node served at the last step, if that task is still in it (else -1)."""
        slot_of = {k: s for s, k in enumerate(self.slot_task.tolist()) if k >= 0}
        return np.array([slot_of.get(k, -1) for k in self.node_task.tolist()], np.int64)

    def _queue_full(self) -> bool:
        return self.cfg.queue_size > 0 and len(self.queue) >= self.cfg.queue_size

    def _record_decision_point(self) -> None:
        """Congestion as the policy sees it, once per step (T samples per episode)."""
        self.stats["full_queue_steps"] += int(self._queue_full())
        self.stats["waiting_sum"] += len(self.queue)

    def _step_info(self, successes: int, expired: int, rejected: int, busy: int) -> dict:
        return {"successes": successes, "expirations": expired, "rejections": rejected,
                "busy_nodes": busy, "full_queue": self._queue_full(), "waiting": len(self.queue),
                "invalid_actions": self.stats["invalid_actions"]}

    def episode_summary(self) -> dict:
        """Whole-episode figures: success rate and the diagnostics of docs/design.md §8. An episode
        without tasks has success rate 0.0 (and readiness NaN: no task was ever ready)."""
        m = len(self.arrival)
        steps = self.cfg.horizon
        ready = self.ready_step[self.ready_step >= 0]
        return {
            "episode_tasks": m,
            "episode_successes": self.stats["successes"],
            "success_rate": self.stats["successes"] / m if m else 0.0,
            "utilisation": self.stats["busy_node_steps"] / (self.cfg.n_nodes * steps),
            "full_queue_fraction": self.stats["full_queue_steps"] / steps,
            "waiting_population": self.stats["waiting_sum"] / steps,
            "readiness_steps": float(ready.mean()) if len(ready) else float("nan"),
            "episode_invalid_actions": self.stats["invalid_actions"],
        }

    def scheduler_view(self) -> SlotView:
        """What a non-learned allocator may read about the active slots (0 for empty ones)."""
        tasks = self.slot_task
        present = tasks >= 0
        held = tasks[present]
        cluster = self.cfg.cluster.enabled  # may be none at all, in an episode without tasks

        def per_slot(values: np.ndarray) -> np.ndarray:
            out = np.zeros(len(tasks), values.dtype)
            out[present] = values[held]
            return out

        return SlotView(
            t=self.t, present=present, arrival=per_slot(self.arrival), deadline=per_slot(self.deadline),
            observed=per_slot(self.n_obs), predicted=per_slot(self.pred), n_nodes=self.cfg.n_nodes,
            optimistic=per_slot(self.pred_low) if self.cfg.optimistic_quantile is not None else None,
            probe_points=self.cfg.probe_points,
            speeds=self.speeds, node_slot=self.node_slots() if cluster else None,
            restore_cost=per_slot(self.restore_cost) if cluster else None,
            restore_left=per_slot(self.restore_left) if cluster else None,
            task=np.maximum(tasks, 0), env_key=(id(self), self.resets),
            eps=per_slot(self.eps), losses=lambda s: self.task_avg[tasks[s], :self.n_obs[tasks[s]]],
        )


def sample_episodes(config: EnvConfig, count: int, seed: int) -> list[Episode]:
    """The episodes `MultiNodeEnv(config)` draws on `reset(seed=seed + i)`, i < count
    (bursts included, at `config.burst_prob`); the predictor plays no part in drawing them."""
    sampler = MultiNodeEnv(replace(config, predictor="wls"))
    episodes = []
    for i in range(count):
        sampler.reset(seed=seed + i)
        episodes.append(sampler.episode)
    return episodes
