"""`train-scheduler` and `submit-scheduler` subcommands.

`register(subparsers)` adds both to the `mara` command line; a submitted Ray
job runs `python -m mara_rl.cli train-scheduler ...`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mara_fm.build_bank import default_bank_path
from mara_fm.profile import PROJECT_ROOT, section_config

if TYPE_CHECKING:
    from mara_rl.train_scheduler import SchedulerConfig

# One table drives both the train parser and the argv forwarded to a Ray job.
TRAIN_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--profile", {"default": "default", "help": "profile name or TOML path"}),
    ("--predictor", {"choices": ["fm", "wls", "oracle"], "help": "predictor inside the env"}),
    ("--fm", {"help": "exported FM predictor (needed for --predictor fm)"}),
    ("--beta", {"type": float, "help": "shaping weight β (0 = sparse reward)"}),
    ("--seed", {"type": int}),
    ("--burst-prob", {"type": float, "help": "share of training episodes with an overload burst"}),
    ("--imitation-episodes", {"type": int, "help": "warm start: imitate the teacher on N training "
                              "episodes before PPO (0 = off; see mara_rl.imitation)"}),
    ("--imitation-teacher", {"help": "fifo | edf | lara (default) | lara_optimistic | llf (both need "
                             "[env] optimistic_quantile) | lara_oracle (LARA on the true remaining "
                             "demand: a privileged teacher)"}),
    ("--dagger-rounds", {"type": int, "help": "warm start: DAgger rounds after imitation "
                         "(imitation_dagger_rounds; 0 = behaviour cloning only)"}),
    ("--anchor", {"type": float, "help": "KL anchor to the warm-started policy during PPO "
                  "(anchor_coeff; 0 = plain PPO; see mara_rl.anchored_ppo)"}),
    ("--iterations", {"type": int, "help": "PPO iterations in total (a resume continues to it)"}),
    ("--num-env-runners", {"type": int}),
    ("--num-envs-per-env-runner", {"type": int}),
    ("--bank", {"help": "curve bank (default data/banks/<profile>.parquet, built if missing)"}),
    ("--out", {"help": "run folder: checkpoint, state, exported policy"}),
    ("--run-name", {"help": "MLflow run name (default: the run folder's name)"}),
    ("--fresh", {"action": "store_true", "help": "discard an existing run folder instead of resuming"}),
]
PATH_FLAGS = ("--fm", "--bank", "--out")


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, options in TRAIN_FLAGS:
        parser.add_argument(flag, **options)


def train_argv(args: argparse.Namespace) -> list[str]:
    """The train flags that were set, as argv; paths made absolute for a job's other cwd."""
    argv: list[str] = []
    for flag, options in TRAIN_FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if options.get("action") == "store_true":
            argv += [flag] if value else []
        elif value is not None:
            argv += [flag, str(Path(value).resolve()) if flag in PATH_FLAGS else str(value)]
    return argv


def default_out(profile: str, cfg: SchedulerConfig) -> Path:
    """A run's folder, named by what sets its variant apart: predictor, β, seed, warm start
    (and its teacher, unless LARA; DAgger rounds), KL anchor."""
    warm = ""
    if cfg.imitation_episodes > 0:
        teacher = "" if cfg.imitation_teacher == "lara" else f"-{cfg.imitation_teacher}"
        warm = f"-imitation{cfg.imitation_episodes}{teacher}"
        if cfg.imitation_dagger_rounds > 0:
            warm += f"-dagger{cfg.imitation_dagger_rounds}"
    if cfg.anchor_coeff > 0:
        warm += f"-anchor{cfg.anchor_coeff:g}"
    return (PROJECT_ROOT / "artifacts" / "scheduler"
            / f"{Path(profile).stem}-{cfg.predictor}-beta{cfg.beta:g}-seed{cfg.seed}{warm}")


def scheduler_config(args: argparse.Namespace) -> Any:
    """The profile's `[scheduler]` section with the command-line overrides applied."""
    from mara_rl.train_scheduler import SchedulerConfig

    return section_config(SchedulerConfig, args.profile, "scheduler", predictor=args.predictor,
                          fm_path=args.fm, beta=args.beta, seed=args.seed, burst_prob=args.burst_prob,
                          imitation_episodes=args.imitation_episodes,
                          imitation_teacher=args.imitation_teacher,
                          imitation_dagger_rounds=args.dagger_rounds, anchor_coeff=args.anchor,
                          iterations=args.iterations,
                          num_env_runners=args.num_env_runners,
                          num_envs_per_env_runner=args.num_envs_per_env_runner)


def cmd_train(args: argparse.Namespace) -> None:
    from mara_fm.build_bank import BankConfig, ensure_bank
    from mara_rl.train_scheduler import train, training_env

    cfg = scheduler_config(args)
    bank = Path(args.bank) if args.bank else default_bank_path(args.profile)
    if not args.bank:
        ensure_bank(section_config(BankConfig, args.profile, "bank"), bank)
    env_cfg = training_env(cfg, args.profile, bank)
    out = Path(args.out) if args.out else default_out(args.profile, cfg)
    policy = train(cfg, env_cfg, out, run_name=args.run_name or out.name, fresh=args.fresh)
    print(f"policy: {policy}")


def cmd_submit(args: argparse.Namespace) -> None:
    from mara_rl.submit import submit_training

    argv = train_argv(args)
    if not args.out:  # a job's working dir is a temporary copy: keep results in this checkout
        cfg = scheduler_config(args)
        argv += ["--out", str(default_out(args.profile, cfg))]
    if not args.bank:  # data/ is not uploaded; point the job at this checkout's bank
        argv += ["--bank", str(default_bank_path(args.profile))]
    job_id, status = submit_training(argv, address=args.address, wait=args.wait,
                                     timeout_s=args.timeout, mlflow_uri=args.mlflow_uri)
    print(f"job {job_id}: {status}")
    if args.wait and status != "SUCCEEDED":
        sys.exit(1)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("train-scheduler", help="train the MAT scheduler with PPO (RLlib)")
    add_train_arguments(p)
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("submit-scheduler", help="submit scheduler training as a Ray job")
    add_train_arguments(p)
    p.add_argument("--address", help="Ray dashboard address (default: $RAY_ADDRESS)")
    p.add_argument("--mlflow-uri", help="tracking URI for the job (default: this side's)")
    p.add_argument("--wait", action="store_true", help="poll until the job ends, echoing its logs")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to wait with --wait")
    p.set_defaults(func=cmd_submit)
