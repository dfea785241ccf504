"""Every setting of scheduler training, declared once (`SchedulerConfig`).

The profile's `[scheduler]` section fills it (`[scheduler.mat]` the
network), `mara train-scheduler` derives a flag from each field
(`mara_common.flags`), and a run's folder is named by the settings that set
it apart from its profile (`run_name`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mara_common.config import ConfigError, check_config, setting
from mara_common.paths import SCHEDULER_RUNS, normal_path
from mara_common.profile import Profile
from mara_env.env import VIEW_OPTIONS, EnvConfig
from mara_env.registry import ALLOCATORS
from mara_fm.build_bank import ensure_history_bank
from mara_fm.predictors import FM_FOLDER
from mara_rl.imitation import TEACHERS
from mara_rl.mat_module import MATConfig

PREDICTORS = ("fm", "recall", "wls", "oracle", "history")
CRITICS = ("shared", "privileged")


@dataclass
class SchedulerConfig:
    """Profile section `[scheduler]`; docs/design.md §7 explains the defaults."""

    # What the env runs.
    predictor: str = setting("wls", choices=PREDICTORS, label="", help="predictor inside the env")
    fm_path: str = setting("", help="exported FM predictor (default: the profile's, for --predictor fm or recall)")
    history_path: str = setting("", help="history bank (default: the profile's, for --predictor history)")
    beta: float = setting(0.1, ge=0.0, label="beta", help="shaping weight β (0 = sparse reward)")
    seed: int = setting(0, ge=0, label="seed", help="training seed")
    burst_prob: float = setting(0.0, ge=0.0, le=1.0, label="burst",
                                help="share of training episodes with an overload burst")
    arrival_prob_max: float | None = setting(None, ge=0.0, le=1.0, label="pmax",
                                             help="training episodes draw their arrival probability "
                                             "from [the profile's, this] (EnvConfig.arrival_prob_max; "
                                             "unset: the profile's)")
    decision_interval: int | None = setting(None, ge=1, label="hold",
                                            help="the policy decides at events, holding each joint action "
                                            "up to N steps (EnvConfig.decision_interval; unset: every step)")
    trend_window: int | None = setting(None, ge=2, label="trend",
                                       help="the policy also sees each task's progress and its trend over "
                                       "the last N observations (EnvConfig.trend_window; unset: not shown)")
    rule_hint: str | None = setting(None, choices=tuple(sorted(ALLOCATORS)), label="hint",
                                    help="the policy also sees this allocator's joint action and starts from it "
                                    "(EnvConfig.rule_hint, a residual policy; unset: not shown)")
    critic: str = setting("shared", choices=CRITICS, label="",
                          help="value function: on the policy's encoder (shared), or its own encoder that "
                          "also reads the true demand of tasks and arrivals (privileged; training only)")
    # PPO (MAT reference: clip 0.05-0.2, entropy 0.01, GAE λ 0.95, 10-15 epochs).
    iterations: int = setting(150, ge=0, resumable=True, help="PPO iterations in total (a resume continues to it)")
    train_batch_size: int = setting(8000, ge=1, help="env steps per PPO iteration")
    minibatch_size: int = setting(1000, ge=1)
    num_epochs: int = setting(10, ge=1)
    lr: float = setting(5e-4, gt=0.0)
    gamma: float = setting(1.0, gt=0.0, le=1.0)
    gae_lambda: float = setting(0.95, ge=0.0, le=1.0)
    clip_param: float = setting(0.2, gt=0.0)
    entropy_coeff: float = setting(0.001, ge=0.0, help="summed over the N nodes: ≈ 0.01 per agent / 7")
    vf_loss_coeff: float = setting(0.5, ge=0.0)
    vf_clip_param: float = setting(1e4, gt=0.0, help="RLlib's 10 would zero the value gradient (returns reach ~20)")
    kl_coeff: float = setting(0.0, ge=0.0, help="PPO's KL penalty (MAT uses none)")
    grad_clip: float = setting(10.0, gt=0.0)
    # Warm start (mara_rl.imitation).
    imitation_episodes: int = setting(0, ge=0, label="imitation",
                                      help="imitate the teacher on N training episodes before PPO (0 = off)")
    imitation_teacher: str = setting("lara", choices=TEACHERS, label="", help="the allocator imitated")
    imitation_epochs: int = setting(20, ge=1)
    imitation_lr: float = setting(1e-3, gt=0.0)
    imitation_dagger_rounds: int = setting(0, ge=0, label="dagger",
                                           help="DAgger rounds after imitation (0 = behaviour cloning only; "
                                           "none without imitation)")
    imitation_dagger_epochs: int = setting(10, ge=1)
    anchor_coeff: float = setting(0.0, ge=0.0, label="anchor",
                                  help="KL anchor to the warm-started policy during PPO (0 = plain PPO)")
    mat: MATConfig = setting(default_factory=MATConfig, help="network ([scheduler.mat])")
    # Sampling.
    num_env_runners: int = setting(2, ge=0, resumable=True, help="RLlib env runners (0 = in the driver)")
    num_envs_per_env_runner: int = setting(8, ge=1)
    pool_predictions: bool = setting(True, resumable=True,
                                     help="step a runner's envs with one predictor call per step")
    sample_timeout_s: float = setting(900.0, gt=0.0, resumable=True,
                                      help="RLlib's 60 s returns no samples when the FM env is slow under load")
    torch_threads: int = setting(1, ge=1, resumable=True, help="learner threads in the driver")
    # Validation on ID val episodes (greedy); it picks the exported iteration.
    eval_every: int = setting(5, ge=0, resumable=True, help="validate every N iterations (0 = never)")
    eval_episodes: int = setting(128, ge=1)
    eval_seed: int = setting(1_000_000, ge=0)
    export_best: bool = setting(True, help="export the best validated policy, not the last")

    def __post_init__(self) -> None:
        check_config(self)
        # One normal form for the predictor's path, whoever gives it; none for a predictor without one.
        self.fm_path = normal_path(self.fm_path) if self.predictor in FM_FOLDER and self.fm_path else ""
        self.history_path = normal_path(self.history_path) if self.predictor == "history" and self.history_path else ""
        # DAgger continues the imitation warm start: without one there is nothing to continue
        # (so IMITATION=0 needs no DAGGER=0 beside it).
        if self.imitation_episodes == 0:
            self.imitation_dagger_rounds = 0
        if self.anchor_coeff > 0 and self.imitation_episodes <= 0:
            raise ConfigError("anchor_coeff > 0 anchors PPO to the warm-started policy: "
                              "it needs imitation_episodes > 0")
        if self.minibatch_size > self.train_batch_size:
            raise ConfigError(f"minibatch_size {self.minibatch_size} exceeds train_batch_size "
                              f"{self.train_batch_size}")

    def predictor_spec(self) -> str:
        if self.predictor in FM_FOLDER:
            if not self.fm_path:
                raise ConfigError(f"predictor {self.predictor!r} needs fm_path (--fm-path) to an exported "
                                  "FM predictor")
            return f"{self.predictor}:{self.fm_path}"
        if self.predictor == "history":
            if not self.history_path:
                raise ConfigError("predictor 'history' needs history_path (--history-path) to a history bank")
            return f"history:{self.history_path}"
        return self.predictor


def scheduler_config(profile: Profile, **overrides: Any) -> SchedulerConfig:
    """The profile's `[scheduler]` with `overrides` (None = keep); an FM or recall run without a
    path reads the profile's exported predictor, a history run the profile's history bank (built
    first if missing)."""
    cfg = profile.section(SchedulerConfig, "scheduler", **overrides)
    if cfg.predictor in FM_FOLDER and not cfg.fm_path:
        cfg = dataclasses.replace(cfg, fm_path=str(profile.paths.predictor))
    if cfg.predictor == "history" and not cfg.history_path:
        bank = ensure_history_bank(profile)
        if bank is None:
            raise ConfigError(f"profile {profile.name!r} has no [history_bank]: --predictor history needs "
                              "one, or --history-path to a history bank")
        cfg = dataclasses.replace(cfg, history_path=str(bank))
    return cfg


def resumable_settings() -> tuple[str, ...]:
    """Operational settings a resume may change; anything else must match the run resumed."""
    return tuple(f.name for f in dataclasses.fields(SchedulerConfig) if f.metadata.get("resumable"))


def run_name(profile: Profile, cfg: SchedulerConfig) -> str:
    """`<profile>-<labelled settings that differ from the profile>-seed<N>`, e.g.
    `default-seed0`, `default-wls-seed1`, `default-beta0-seed0`."""
    base = scheduler_config(profile)
    parts = [profile.name]
    for f in dataclasses.fields(SchedulerConfig):
        label = f.metadata.get("label")
        value = getattr(cfg, f.name)
        if label is None or f.name == "seed" or value == getattr(base, f.name):
            continue
        parts.append(f"{label}{value:g}" if isinstance(value, float) else f"{label}{value}")
    return "-".join([*parts, f"seed{cfg.seed}"])


def default_out(profile: Profile, cfg: SchedulerConfig) -> Path:
    """The run folder of `cfg` under `artifacts/scheduler/`."""
    return SCHEDULER_RUNS / run_name(profile, cfg)


def training_env(cfg: SchedulerConfig, profile: Profile, bank: Path) -> EnvConfig:
    """The env a scheduler trains in: the profile's `[env]` on ID train, with this run's
    predictor, β, burst share, load range, decision interval, trend, rule hint and critic features (the
    rules of the evaluation keep `[env]`'s)."""
    shown = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
             if f.name in VIEW_OPTIONS and getattr(cfg, f.name)}
    return profile.section(EnvConfig, "env", bank=normal_path(bank), predictor=cfg.predictor_spec(),
                           beta=cfg.beta, task_set="id", split="train", burst_prob=cfg.burst_prob,
                           arrival_prob_max=cfg.arrival_prob_max,
                           critic_features=cfg.critic == "privileged", **shown)
