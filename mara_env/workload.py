"""Workloads: which tasks arrive when, with what threshold and service window.

Per task: a family (uniform), one of its runs, a target demand, and from
those a threshold and a window (all defaults in `WorkloadConfig`):

  n_t ~ U[target_lo·s, target_hi·s]            target demand in batches
  ε   = R(n_t) · exp(N(0, eps_jitter))        threshold
  W   = round(n_w · U[window_lo, window_hi])  window, clipped to [min_window, cap]

With `threshold_source="curve"` (default) R is the task's own run; with
"family", R is the `eps_quantile` quantile of the family's runs. n_w, the
demand the window is sized to, is where R first reaches R(n_t)
(`window_basis="crossing"`, default) or n_t itself ("target"). The two agree
on a curve whose cumulative average is still falling at n_t (≈ 91% of ID and
95% of ViT draws); they part on curves that dip and rise again, such as the
DQN TD losses of RL OOD, whose un-jittered threshold is first reached at a
median 0.57·n_t. Sizing those windows to n_t gave RL OOD tasks about twice
the slack of ID's (median slack 48% of the window against 25%) and little
contention, so every allocator sat near the bound there. With "crossing" the
jitter and the window factor decide feasibility for every family alike. A fraction
`unreachable_frac` of tasks gets a threshold below anything its run reaches
(a target set too ambitiously): serving those is pure waste. Deadlines are
clipped to the horizon.

`fit_horizon` (default on) sizes demands to the time left: s = min(1, (T −
arrival) / (window_lo · target_hi)), so a task submitted late asks for
proportionally less (s = 1 otherwise). Without it, late arrivals with long
demands cannot finish before the horizon, and heavy demand — which is what
creates contention — pushed the Oracle bound far below docs/design.md's 65–75% band;
with it, the defaults give on ID val at p = 0.04 (5 × 8 episodes) an Oracle
bound of 73.1%, FIFO 49.7%, EDF 55.3%, LARA 57.1%, LARA-FM 61.1%, LARA with
true demand 66.6% and node utilisation ≈ 71% (docs/decisions.md; the scan over settings
is `experiments/probes/calibrate_workload.py`).
Episodes are plain data (curve ids, arrival, ε, window), so frozen evaluation
episodes are saved once and replayed by every method.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mara_common.config import ConfigError, check_config, setting
from mara_common.paths import write_text_atomic
from mara_env.cluster import steps_alone
from mara_fm.bank import CurveSet
from mara_fm.predictors import first_crossing


def check_pair(obj: Any, field: str, *, ge: float | None = None, gt: float | None = None,
               lt: float | None = None) -> None:
    """A (lo, hi) field of `obj`: lo <= hi, and both within the given bounds."""
    lo, hi = getattr(obj, field)
    where = f"{type(obj).__name__}.{field}"
    if lo > hi:
        raise ConfigError(f"{where} must be an ordered pair (lo <= hi), got ({lo}, {hi})")
    if (ge is not None and lo < ge) or (gt is not None and lo <= gt) or (lt is not None and hi >= lt):
        bounds = " and ".join(f"{word} {b}" for b, word in ((ge, ">="), (gt, ">"), (lt, "<")) if b is not None)
        raise ConfigError(f"{where} must lie in {bounds}, got ({lo}, {hi})")


@dataclass(frozen=True)
class WorkloadConfig:
    target_lo: int = setting(150, ge=1, help="lowest target demand, in batches (before fit_horizon)")
    target_hi: int = setting(290, ge=1, help="highest target demand, in batches (>= target_lo)")
    threshold_source: str = setting("curve", choices=("curve", "family"),
                                    help="whose losses set ε: the task's own run or its family's quantile")
    unreachable_frac: float = setting(0.2, ge=0.0, le=1.0,
                                      help="share of tasks whose ε lies below anything their run reaches")
    # ε = min L · U[margin], 0 < lo <= hi < 1 (below the lowest loss)
    unreachable_margin: tuple[float, float] = setting((0.7, 0.95), help="ε of an unreachable task, × its run's lowest loss")
    eps_quantile: float = setting(0.5, ge=0.0, le=1.0, help="family quantile with threshold_source='family'")
    eps_jitter: float = setting(0.03, ge=0.0, help="σ of ε's log-normal jitter")
    window_lo: float = setting(1.1, gt=0.0, help="lowest window factor (× the demand the window is sized to)")
    window_hi: float = setting(1.8, gt=0.0, help="highest window factor (>= window_lo)")
    min_window: int = setting(30, ge=1, help="shortest window, in steps")
    window_basis: str = setting("crossing", choices=("crossing", "target"),
                                help="what the window factor multiplies")
    # Size demands to the time left: a task arriving with fewer than window_lo · target_hi
    # steps before the horizon gets its demand range shrunk in proportion (see module doc).
    fit_horizon: bool = setting(True, help="shrink the demands of late arrivals to the time left")

    def __post_init__(self) -> None:
        check_config(self)
        if self.target_lo > self.target_hi:
            raise ConfigError(f"WorkloadConfig.target_lo must be <= target_hi, got {self.target_lo} > {self.target_hi}")
        if self.window_lo > self.window_hi:
            raise ConfigError(f"WorkloadConfig.window_lo must be <= window_hi, got {self.window_lo} > {self.window_hi}")
        check_pair(self, "unreachable_margin", gt=0.0, lt=1.0)


@dataclass
class Episode:
    """One episode's tasks, in arrival order. Deadlines are clipped to the horizon."""

    curve_ids: list[str]
    arrival: np.ndarray  # (M,) int
    eps: np.ndarray  # (M,) float
    window: np.ndarray  # (M,) int
    horizon: int
    meta: dict

    def __post_init__(self) -> None:
        self.arrival = np.asarray(self.arrival, np.int64)
        self.eps = np.asarray(self.eps, np.float64)
        self.window = np.asarray(self.window, np.int64)

    @property
    def deadline(self) -> np.ndarray:
        return np.minimum(self.arrival + self.window, self.horizon)

    def __len__(self) -> int:
        return len(self.curve_ids)

    def to_dict(self) -> dict:
        return {
            "curve_ids": list(self.curve_ids), "arrival": self.arrival.tolist(),
            "eps": self.eps.tolist(), "window": self.window.tolist(),
            "horizon": self.horizon, "meta": self.meta,
        }

    @staticmethod
    def from_dict(d: dict) -> Episode:
        return Episode(d["curve_ids"], d["arrival"], d["eps"], d["window"], d["horizon"], d["meta"])


def family_reference(curves: CurveSet, quantile: float) -> dict[str, np.ndarray]:
    """Per family, the `quantile` of its cumulative-average losses at every batch."""
    avg = curves.avg
    return {f: np.quantile(avg[curves.families == f], quantile, axis=0) for f in curves.family_names()}


def demand_range(cfg: WorkloadConfig, time_left: int) -> tuple[int, int]:
    """The target-demand range of a task with `time_left` steps before the horizon."""
    if not cfg.fit_horizon:
        return cfg.target_lo, cfg.target_hi
    scale = min(1.0, time_left / (cfg.window_lo * cfg.target_hi))
    lo = max(1, int(cfg.target_lo * scale))
    return lo, max(lo, int(cfg.target_hi * scale))


def draw_tasks(curves: CurveSet, reference: dict[str, np.ndarray] | None, n: int, cfg: WorkloadConfig,
               rng: np.random.Generator, time_left: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Curve rows, thresholds and windows for `n` tasks (families uniform, then curves);
    `time_left` holds each task's steps from arrival to the horizon."""
    if cfg.threshold_source not in ("curve", "family"):
        raise ValueError(f"WorkloadConfig.threshold_source must be 'curve' or 'family', "
                         f"got {cfg.threshold_source!r}")
    if cfg.window_basis not in ("crossing", "target"):
        raise ValueError(f"WorkloadConfig.window_basis must be 'crossing' or 'target', "
                         f"got {cfg.window_basis!r}")
    fams = curves.family_names()
    rows = np.empty(n, np.int64)
    eps = np.empty(n)
    window = np.empty(n, np.int64)
    for i in range(n):
        fam = fams[rng.integers(len(fams))]
        members = np.flatnonzero(curves.families == fam)
        rows[i] = members[rng.integers(len(members))]
        lo, hi = demand_range(cfg, int(time_left[i]))
        target = int(rng.integers(lo, hi + 1))
        ref = curves.avg[rows[i]] if cfg.threshold_source == "curve" else reference[fam]
        level = ref[min(target, curves.cap) - 1]
        basis = target if cfg.window_basis == "target" else \
            int(first_crossing(ref[None], np.zeros(1, np.int64), np.array([level]), np.array([target]))[0])
        eps[i] = level * np.exp(rng.normal(0, cfg.eps_jitter))
        if rng.random() < cfg.unreachable_frac:
            eps[i] = curves.avg[rows[i]].min() * rng.uniform(*cfg.unreachable_margin)
        w = round(basis * rng.uniform(cfg.window_lo, cfg.window_hi))
        window[i] = int(np.clip(w, cfg.min_window, curves.cap))
    return rows, eps, window


def sample_episode(curves: CurveSet, horizon: int, arrival_prob: float, cfg: WorkloadConfig,
                   rng: np.random.Generator, reference: dict[str, np.ndarray] | None = None,
                   meta: dict | None = None) -> Episode:
    """Bernoulli(p) arrivals at every step of [0, horizon)."""
    arrival = np.flatnonzero(rng.random(horizon) < arrival_prob)
    if reference is None and cfg.threshold_source == "family":
        reference = family_reference(curves, cfg.eps_quantile)
    rows, eps, window = draw_tasks(curves, reference, len(arrival), cfg, rng, horizon - arrival)
    return Episode(curves.ids[rows].tolist(), arrival, eps, window, horizon, dict(meta or {}))


def doomed_tasks(curves: CurveSet, n: int, rng: np.random.Generator) -> tuple[list[str], list[float]]:
    """`n` distinct curves with thresholds at half their lowest loss: they can never finish."""
    if n > len(curves):
        raise ValueError(f"{n} doomed tasks need {n} distinct curves; the curve set has {len(curves)}")
    rows = rng.permutation(len(curves))[:n]
    return [curves.ids[r] for r in rows], [0.5 * float(curves.avg[r].min()) for r in rows]


def short_tasks(curves: CurveSet, n: int, demand: tuple[int, int],
                rng: np.random.Generator) -> tuple[list[str], list[float]]:
    """`n` (curve, ε) pairs whose ε is first reached after a number of batches in `demand`.

    Curves may repeat (each task replays its own copy), so small banks work too.
    """
    avg = curves.avg
    ids: list[str] = []
    eps: list[float] = []
    for _ in range(200 * n):
        if len(ids) == n:
            break
        row = int(rng.integers(len(curves)))
        n_star = int(rng.integers(demand[0], demand[1] + 1))
        if np.all(avg[row, : n_star - 1] > avg[row, n_star - 1]):
            ids.append(curves.ids[row])
            eps.append(float(avg[row, n_star - 1]))
    if len(ids) < n:
        raise ValueError(f"too few curves first reach a threshold in {demand} batches")
    return ids, eps


def stress_episode(curves: CurveSet, horizon: int = 500, n_infeasible: int = 7, n_short: int = 13,
                   short_arrival: int = 10, short_demand: tuple[int, int] = (22, 35),
                   infeasible_window: int = 100, short_window: int = 110, seed: int = 0) -> Episode:
    """docs/design.md §8's stress test: tasks that can never finish come first.

    The infeasible tasks (thresholds below anything their curves reach)
    arrive at t=0 and expire at t=100; the short tasks arrive at t=10 with
    true demand in [22, 35] and deadline 120. Serving the infeasible tasks
    until they expire leaves 20 steps, too few for any short task; ignoring
    them leaves ample room for all 13 (7 nodes, 110 steps).
    """
    rng = np.random.default_rng(seed)
    ids, eps = doomed_tasks(curves, n_infeasible, rng)
    more_ids, more_eps = short_tasks(curves, n_short, short_demand, rng)
    arrival = [0] * n_infeasible + [short_arrival] * n_short
    window = [infeasible_window] * n_infeasible + [short_window] * n_short
    return Episode(ids + more_ids, arrival, eps + more_eps, window, horizon, {"scenario": "stress"})


@dataclass(frozen=True)
class BurstConfig:
    """A randomised stress pattern that training may add to an episode.

    At a random step, `doomed` tasks that can never finish arrive with a
    window in `doomed_window`; `delay` steps later `short` tasks arrive that
    need `short_demand` batches and whose deadlines fall `slack` steps after
    the doomed ones'. Serving the doomed tasks first starves the short ones;
    a scheduler only meets this in training if some episodes contain it.
    """

    doomed: tuple[int, int] = setting((3, 7), help="doomed tasks per burst (lo, hi), >= 0")
    short: tuple[int, int] = setting((6, 13), help="short tasks per burst (lo, hi), >= 0")
    short_demand: tuple[int, int] = setting((15, 40), help="batches a short task needs (lo, hi), >= 1")
    doomed_window: tuple[int, int] = setting((60, 110), help="window of the doomed tasks (lo, hi), >= 1")
    delay: tuple[int, int] = setting((3, 20), help="steps from the doomed tasks' arrival to the short ones' (lo, hi), >= 0")
    slack: tuple[int, int] = setting((5, 30), help="steps the short deadlines fall after the doomed ones (lo, hi), >= 0")

    def __post_init__(self) -> None:
        check_config(self)
        for name, least in (("doomed", 0), ("short", 0), ("short_demand", 1), ("doomed_window", 1),
                            ("delay", 0), ("slack", 0)):
            check_pair(self, name, ge=least)
        shortest = self.doomed_window[0] - self.delay[1] + self.slack[0]
        if shortest < 1:
            raise ConfigError(f"BurstConfig.doomed_window, delay and slack leave short tasks a window of "
                              f"doomed_window - delay + slack = {shortest} < 1 steps at worst")


def add_burst(episode: Episode, curves: CurveSet, cfg: BurstConfig, rng: np.random.Generator) -> Episode:
    """`episode` with one burst (see `BurstConfig`) merged in, still in arrival order."""
    def draw(bounds: tuple[int, int]) -> int:
        return int(rng.integers(bounds[0], bounds[1] + 1))

    n_doomed, n_short, doomed_window, delay = draw(cfg.doomed), draw(cfg.short), draw(cfg.doomed_window), draw(cfg.delay)
    short_window = doomed_window - delay + draw(cfg.slack)
    start = int(rng.integers(0, max(1, episode.horizon - delay - short_window)))
    ids, eps = doomed_tasks(curves, n_doomed, rng)
    more_ids, more_eps = short_tasks(curves, n_short, cfg.short_demand, rng)
    if start + delay >= episode.horizon:  # a horizon too short for the burst: the short tasks would
        more_ids, more_eps, n_short = [], [], 0  # arrive after it (drawn all the same: the rng's stream)
    arrival = np.concatenate([episode.arrival, np.full(n_doomed, start), np.full(n_short, start + delay)])
    window = np.concatenate([episode.window, np.full(n_doomed, doomed_window), np.full(n_short, short_window)])
    order = np.argsort(arrival, kind="stable")
    all_ids = list(episode.curve_ids) + ids + more_ids
    return Episode([all_ids[i] for i in order], arrival[order], np.concatenate([episode.eps, eps, more_eps])[order],
                   window[order], episode.horizon,
                   {**episode.meta, "burst": {"start": start, "delay": delay, "doomed": n_doomed, "short": n_short}})


def true_demand(episode: Episode, curves: CurveSet) -> np.ndarray:
    """Batches each task needs from scratch to reach ε (cap+1 if never)."""
    rows = curve_rows(episode, curves)
    avg = curves.avg[rows]
    return first_crossing(avg, np.zeros(len(rows), np.int64), episode.eps,
                          np.full(len(rows), curves.cap + 1.0))


def slack(episode: Episode, curves: CurveSet, speed: float = 1.0) -> np.ndarray:
    """Per task, its servable steps minus the steps it truly needs alone on a node of
    `speed` (≥ 0: feasible); at speed 1, the batches it needs."""
    return (episode.deadline - episode.arrival) - steps_alone(true_demand(episode, curves), episode.arrival, speed)


def oracle_successes(episode: Episode, curves: CurveSet, speed: float = 1.0) -> int:
    """Tasks feasible alone on a dedicated node of `speed` (the fastest) from arrival, with
    no restore: the upper bound."""
    return int((slack(episode, curves, speed) >= 0).sum())


def curve_rows(episode: Episode, curves: CurveSet) -> np.ndarray:
    index = {cid: i for i, cid in enumerate(curves.ids)}
    missing = [c for c in episode.curve_ids if c not in index]
    if missing:
        raise KeyError(f"episode refers to curve(s) not in this bank: {missing[:3]}")
    return np.array([index[c] for c in episode.curve_ids], np.int64)


def save_episodes(episodes: list[Episode], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps([e.to_dict() for e in episodes]))


def load_episodes(path: str | Path) -> list[Episode]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: frozen episode file not found")
    try:
        return [Episode.from_dict(d) for d in json.loads(path.read_text())]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed frozen episode file ({exc})") from exc
