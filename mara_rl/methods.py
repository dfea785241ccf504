"""The one registry of evaluation methods: what each is, what it needs, how it decides.

The evaluator, the pipeline and the report read it: a method added here is
evaluated by `mara evaluate-all` and shown in the report, nowhere else to
edit. Kinds: a `rule` reads only the observation (a hand-written allocator
the learned scheduler has to beat); a `history` method also knows each task's
job kind and earlier finished runs of it (a setting beyond the paper's,
reported beside it); a `reference` is told each task's true demand (how far
better forecasts could go); the `bound` is the Oracle, each task alone on a
node (docs/design.md §6).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_env.env import VIEW_OPTIONS, EnvConfig
from mara_env.registry import ALLOCATORS
from mara_env.vector import BatchDecide
from mara_fm.predictors import FM_FOLDER
from mara_rl.policy import act, load_policy, policy_env

KINDS = ("rule", "history", "reference", "bound")
VIEWS = ("none", "quantile", "profile")
PREDICTORS = ("wls", "oracle", "fm", "recall", "history")


@dataclass(frozen=True)
class MethodSpec:
    """A non-learned method: an allocator and the predictor its env runs."""

    name: str
    allocator: str | None  # a key of ALLOCATORS; None for the Oracle bound (not simulated)
    # wls | oracle | fm (the profile's exported FM predictor) | recall (FM with its training runs as
    # a memory, docs/design.md §5.6) | history (the profile's history bank)
    predictor: str
    # The env's view options it runs with: "none" (the base observation), "quantile" (the
    # optimistic estimate alone), "profile" (all of the profile's, as MARA's teacher does).
    view: str = "none"
    kind: str = "rule"
    help: str = ""
    # The env's decision_interval it runs with: decisions at events, each held up to this many
    # steps (docs/design.md §3). None: a decision every step.
    hold: int | None = None

    def __post_init__(self) -> None:
        for field_name, known in (("kind", KINDS), ("view", VIEWS), ("predictor", PREDICTORS)):
            value = getattr(self, field_name)
            if value not in known:
                raise ValueError(f"method {self.name!r}: {field_name} must be one of {list(known)}, got {value!r}")

    def needs(self) -> list[str]:
        """What the profile or the command must provide for this method to run."""
        return (["an FM predictor"] if self.predictor in FM_FOLDER else []) + \
            (["a history bank ([history_bank])"] if self.predictor == "history" else []) + \
            (["[env] optimistic_quantile"] if self.view != "none" else [])


BUILTIN: tuple[MethodSpec, ...] = (
    MethodSpec("fifo", "fifo", "wls", help="the earliest arrivals first"),
    MethodSpec("edf", "edf", "wls", help="the earliest deadlines first"),
    MethodSpec("lara", "lara", "wls", help="LARA on WLS forecasts (the paper's baseline)"),
    MethodSpec("lara_fm", "lara", "fm", help="LARA on FM forecasts"),
    MethodSpec("lara_fm_optimistic", "lara_optimistic", "fm", view="profile",
               help="LARA on FM's optimistic quantile, probing new tasks first: MARA's teacher"),
    MethodSpec("llf_fm", "llf", "fm", view="profile",
               help="exact feasibility test and least-laxity service on FM forecasts"),
    MethodSpec("lara_fm_optimistic_held", "lara_optimistic", "fm", view="profile", hold=20,
               help="MARA's teacher deciding only at events (each decision held up to 20 steps)"),
    MethodSpec("llf_fm_held", "llf", "fm", view="profile", hold=20, help="llf_fm deciding only at events"),
    MethodSpec("lara_recall_optimistic", "lara_optimistic", "recall", view="profile",
               help="MARA's teacher on the recall predictor's forecasts"),
    MethodSpec("llf_recall", "llf", "recall", view="profile", help="llf on the recall predictor's forecasts"),
    MethodSpec("las", "las", "wls", help="Tiresias-style least attained service, no forecasts"),
    MethodSpec("optimus", "optimus", "wls", help="Optimus-style online loss fit, shortest remaining first"),
    MethodSpec("admission_fm", "admission", "fm",
               help="ElasticFlow/Chronus-style deadline admission on FM forecasts, EDF service"),
    MethodSpec("lara_history_optimistic", "lara_optimistic", "history", view="profile", kind="history",
               help="MARA's teacher on forecasts from earlier runs of each task's job kind"),
    MethodSpec("llf_history", "llf", "history", view="profile", kind="history",
               help="llf on forecasts from earlier runs of each task's job kind"),
    MethodSpec("lara_oracle", "lara", "oracle", kind="reference", help="LARA told the true demand"),
    MethodSpec("llf_oracle", "llf", "oracle", view="quantile", kind="reference",
               help="the least-laxity planner told the true demand"),
    MethodSpec("oracle", None, "oracle", kind="bound", help="each task alone on a node: the upper bound"),
)
SPECS = {spec.name: spec for spec in BUILTIN}


@dataclass(frozen=True)
class Variant:
    """A learned scheduler of the protocol: its method name and its training overrides."""

    name: str
    overrides: tuple[tuple[str, Any], ...]  # SchedulerConfig fields
    # Trained by a profile whose [evaluation] does not list its variants. The recall and history
    # variants are not: a profile asks for them by name (the history variant needs a history bank).
    standard: bool = True

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.overrides)


VARIANTS = (
    Variant("mara", (("predictor", "fm"),)),
    Variant("mara_wls", (("predictor", "wls"),)),
    Variant("sparse", (("predictor", "fm"), ("beta", 0.0))),
    Variant("mara_recall", (("predictor", "recall"),), standard=False),
    Variant("mara_history", (("predictor", "history"),), standard=False),
)


def rule_names(reference: str | None = None) -> list[str]:
    """The hand-written methods a learned `reference` is measured against: the observation-only
    rules, and for a variant told job kinds (one trained on the history predictor) also the
    rules told them, so that the policy is not credited with what its information gives a rule."""
    told = any(v.name == reference and v.settings.get("predictor") == "history" for v in VARIANTS)
    return [s.name for s in BUILTIN if s.kind == "rule" or (told and s.kind == "history")]


@dataclass(frozen=True)
class Method:
    """How a method decides, and which predictor the env runs for it."""

    name: str
    predictor: str
    make: Callable[[], BatchDecide] | None  # None: the Oracle bound, not simulated
    seed: int | None = None  # scheduler training seed; None for methods that are not trained
    # The env's `VIEW_OPTIONS` the method runs with; those not named are off (the base observation).
    view: dict[str, Any] = field(default_factory=dict)
    # A policy's `EnvConfig.cluster` (as a dict): the evaluation must run the same.
    cluster: dict[str, Any] | None = None
    policy: str | None = None  # a learned method's exported policy folder

    @property
    def label(self) -> str:
        return self.name if self.seed is None else f"{self.name} (seed {self.seed})"

    def env_config(self, env_cfg: EnvConfig, **extra: Any) -> EnvConfig:
        """`env_cfg` with this method's predictor and view options (the others off)."""
        return EnvConfig(**{**asdict(env_cfg), **dict.fromkeys(VIEW_OPTIONS), **self.view,
                            "predictor": self.predictor, **extra})


def classic(name: str) -> Callable[[], BatchDecide]:
    """A batch decision rule from the allocator `name` (one allocator per call of `make`).

    `make` is a partial of a module-level function rather than a closure, as is a learned
    method's, so that a method pickles and the evaluation can hand it to a worker process.
    """
    return functools.partial(_rule, name)


def _rule(name: str) -> BatchDecide:
    allocator = ALLOCATORS[name]()
    return lambda obs, envs: np.stack([allocator.act(env.scheduler_view()) for env in envs])


def _policy(policy_dir: str) -> BatchDecide:
    module = load_policy(policy_dir)
    return lambda obs, envs: act(module, obs)


def learned(name: str, policy_dir: str | Path, seed: int | None = None) -> Method:
    """An exported MAT policy, run with the predictor it was trained with.

    Several policies may share `name` with different training `seed`s: their
    records then differ only in `Record.seed`, so seeds are paired by value.
    """
    trained_in = policy_env(policy_dir)
    predictor, cluster = trained_in.pop("predictor"), trained_in.pop("cluster")
    return Method(name, predictor, functools.partial(_policy, str(policy_dir)), seed, view=trained_in,
                  cluster=cluster, policy=str(policy_dir))


def builtin_methods(fm_path: str | Path | None, view: dict[str, Any],
                    history_path: str | Path | None = None) -> dict[str, Method]:
    """The registry's methods that can run here: those reading FM need `fm_path`, the history
    methods a history bank at `history_path`, those reading the optimistic estimate the
    profile's `optimistic_quantile` in `view`."""
    quantile = view.get("optimistic_quantile")
    views = {"none": {}, "quantile": {"optimistic_quantile": quantile}, "profile": dict(view)}
    methods = {}
    paths = {"fm": fm_path, "recall": fm_path, "history": history_path}
    for spec in BUILTIN:
        if (spec.predictor in paths and not paths[spec.predictor]) or (spec.view != "none" and quantile is None):
            continue
        predictor = f"{spec.predictor}:{paths[spec.predictor]}" if spec.predictor in paths else spec.predictor
        make = classic(spec.allocator) if spec.allocator else None
        held = {"decision_interval": spec.hold} if spec.hold else {}
        methods[spec.name] = Method(spec.name, predictor, make, view={**views[spec.view], **held})
    return methods


def unavailable(names: list[str], available: dict[str, Method]) -> str:
    """Why each of `names` cannot run here (empty when all can)."""
    reasons = []
    for name in names:
        if name in available:
            continue
        spec = SPECS.get(name)
        reasons.append(f"{name} (needs {' and '.join(spec.needs())})" if spec else
                       f"{name} (unknown; known: {sorted(SPECS)})")
    return "; ".join(reasons)


def parse_policies(text: str | None) -> dict[tuple[str, int | None], str]:
    """`NAME[@SEED]=POLICY_DIR,...` → {(name, training seed or None): dir}.

    The seed lets several training runs of one method enter the report as
    that method's seeds (e.g. `mara@1=...,mara@2=...` beside the pipeline's seed 0).
    """
    policies = {}
    for item in comma_list(text, "--policies"):
        key, _, path = item.partition("=")
        name, at, seed = key.partition("@")
        if not name or not path or (at and not seed.isdigit()):
            raise ConfigError(f"--policies entry {item!r} should be NAME=POLICY_DIR or NAME@SEED=POLICY_DIR")
        if name in SPECS:
            raise ConfigError(f"--policies entry {item!r}: {name!r} is a built-in method; name it otherwise")
        policies[(name, int(seed) if at else None)] = path
    return policies
