"""Job streams: which real training jobs arrive when, with what threshold and deadline.

A stream is a JSON file (`save_stream` writes one)::

    {"horizon": 500,
     "jobs": [{"kind": "mlp_digits", "seed": 17, "eps": 0.31, "arrival": 4, "window": 180}, ...]}

`kind` is a bank family (`mara_fm.families.FAMILIES`) or an import path
`package.module:build` to a user's function `build(seed, planned) -> TrainingJob`
(`mara_fm.jobs`). `eps` is the target loss in the job's own units — the
simulator's rule compares it with the cumulative average of the job's batch
losses — and the deadline is arrival + window, clipped to the horizon.

`generate_stream` draws a stream with the simulator's workload from a bank
split: each drawn bank curve sets its task's threshold and window, as in
simulation, and the live job is a fresh run of the same family (a new seed,
never one of the bank's), recorded as `stand_in` so that the simulator's
prediction for the stream can be replayed on the bank's curve.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mara_common.config import ConfigError
from mara_env.env import EnvConfig, load_curves
from mara_env.workload import Episode, family_reference, sample_episode
from mara_fm.families import FAMILIES
from mara_fm.jobs import TrainingJob

LIVE_SEED_SALT = 0x11FE  # keeps a stream's run seeds apart from the bank's


@dataclass(frozen=True)
class JobSpec:
    kind: str
    seed: int
    eps: float
    arrival: int
    window: int
    stand_in: str = ""  # the bank curve that set eps and window (generated streams only)
    batch_size: int = 0  # a user's job states these (the predictors read them);
    lr: float = 0.0  # a family's come from its seed


@dataclass(frozen=True)
class Stream:
    horizon: int
    jobs: tuple[JobSpec, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @functools.cached_property
    def ids(self) -> list[str]:
        """The jobs' names, in arrival order; also their curve ids in a live bank."""
        return [f"job-{i:04d}" for i in range(len(self.jobs))]

    def episode(self) -> Episode:
        """The stream as the simulator's episode over the live curves (`ids`)."""
        return Episode(self.ids, [j.arrival for j in self.jobs], [j.eps for j in self.jobs],
                       [j.window for j in self.jobs], self.horizon, {"stream": self.meta})

    def stand_in_episode(self) -> Episode:
        """The same stream over the bank curves that set its thresholds (generated streams)."""
        if not all(j.stand_in for j in self.jobs):
            raise ConfigError("this stream names no bank curves (stand_in): it was not generated from a bank")
        episode = self.episode()
        episode.curve_ids = [j.stand_in for j in self.jobs]
        return episode


def job_builder(kind: str) -> Callable[[int, int], TrainingJob]:
    """`build(seed, planned)` for a family name or a `module:function` import path."""
    if kind in FAMILIES:
        return FAMILIES[kind].job
    module, _, name = kind.partition(":")
    if not name:
        raise ConfigError(f"job kind {kind!r}: not a bank family ({sorted(FAMILIES)}) nor a 'module:function' path")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"job kind {kind!r}: cannot import it ({exc})") from None


def hyperparameters(job: JobSpec) -> tuple[int, float]:
    """The batch size and learning rate the predictors read: a family's draw from the
    seed, or what a user's job states in the stream."""
    return FAMILIES[job.kind].hyperparameters(job.seed) if job.kind in FAMILIES else (job.batch_size, job.lr)


def check_stream(stream: Stream, where: str) -> Stream:
    """Raise ConfigError naming the first malformed job: times, thresholds, order, kinds."""
    if stream.horizon < 1:
        raise ConfigError(f"{where}: horizon must be >= 1, got {stream.horizon}")
    last = 0
    for i, job in enumerate(stream.jobs):
        name = f"{where}: job {i} ({job.kind})"
        if not 0 <= job.arrival < stream.horizon:
            raise ConfigError(f"{name}: arrival {job.arrival} outside [0, horizon {stream.horizon})")
        if job.arrival < last:
            raise ConfigError(f"{name}: jobs must be listed in arrival order ({job.arrival} after {last})")
        if job.window < 1:
            raise ConfigError(f"{name}: window must be >= 1 step, got {job.window}")
        if not (np.isfinite(job.eps) and job.eps > 0):
            raise ConfigError(f"{name}: eps must be a positive finite loss, got {job.eps}")
        job_builder(job.kind)
        if job.kind not in FAMILIES and not (job.batch_size >= 1 and job.lr > 0):
            raise ConfigError(f"{name}: a job that is not a bank family must state batch_size >= 1 and lr > 0")
        last = job.arrival
    return stream


def load_stream(path: str | Path) -> Stream:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: stream file not found")
    try:
        raw = json.loads(path.read_text())
        jobs = tuple(JobSpec(kind=str(j["kind"]), seed=int(j["seed"]), eps=float(j["eps"]),
                             arrival=int(j["arrival"]), window=int(j["window"]),
                             stand_in=str(j.get("stand_in", "")), batch_size=int(j.get("batch_size", 0)),
                             lr=float(j.get("lr", 0.0))) for j in raw["jobs"])
        stream = Stream(int(raw["horizon"]), jobs, dict(raw.get("meta", {})))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a job stream ({exc.__class__.__name__}: {exc}); "
                          "expected {\"horizon\": T, \"jobs\": [{kind, seed, eps, arrival, window}, ...]}") from None
    return check_stream(stream, str(path))


def save_stream(stream: Stream, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"horizon": stream.horizon, "meta": stream.meta,
                                "jobs": [asdict(j) for j in stream.jobs]}, indent=1))
    return path


def generate_stream(env_cfg: EnvConfig, seed: int) -> Stream:
    """A stream drawn with `env_cfg`'s workload (horizon, arrival probability, thresholds)
    from its bank split; each job a fresh run of its stand-in curve's family."""
    curves = load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split)
    wl = env_cfg.workload
    reference = family_reference(curves, wl.eps_quantile) if wl.threshold_source == "family" else None
    episode = sample_episode(curves, env_cfg.horizon, env_cfg.arrival_prob, wl, np.random.default_rng(seed),
                             reference)
    family = dict(zip(curves.ids.tolist(), curves.families.tolist(), strict=True))
    run_seeds = np.random.SeedSequence([seed, LIVE_SEED_SALT]).generate_state(len(episode)) & 0x7FFFFFFF
    jobs = tuple(JobSpec(family[cid], int(s), float(e), int(a), int(w), cid) for cid, s, e, a, w in
                 zip(episode.curve_ids, run_seeds, episode.eps, episode.arrival, episode.window, strict=True))
    meta = {"seed": seed, "task_set": env_cfg.task_set, "split": env_cfg.split, "arrival_prob": env_cfg.arrival_prob}
    return check_stream(Stream(env_cfg.horizon, jobs, meta), f"stream {seed}")
