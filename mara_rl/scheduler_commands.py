"""`train-scheduler` and `submit-scheduler` subcommands.

Both take one flag per `SchedulerConfig` setting (derived from its fields);
a submitted Ray job runs `python -m mara_rl.cli train-scheduler ...` with
the same settings, after everything it needs has been checked here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mara_common.flags import add_flags, overrides, to_argv
from mara_common.paths import PROFILE_DIR, normal_path
from mara_common.profile import Profile
from mara_common.tracking import ensure_experiment
from mara_fm.build_bank import profile_bank
from mara_fm.predictors import FM_FOLDER, predictor_digest
from mara_rl.scheduler_config import SchedulerConfig, default_out, scheduler_config, training_env
from mara_rl.submit import check_cluster, submit_command
from mara_rl.train_scheduler import EXPERIMENT, train


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bank", help="curve bank (default data/banks/<profile>.parquet, built if missing)")
    parser.add_argument("--out", help="run folder (default artifacts/scheduler/<run name>)")
    parser.add_argument("--run-name", help="MLflow run name (default: the run folder's name)")
    parser.add_argument("--fresh", action="store_true", help="discard an existing run folder instead of resuming")
    add_flags(parser, SchedulerConfig)

def planned_run(args: argparse.Namespace, build_bank: bool) -> tuple[SchedulerConfig, Path, Path]:
    """(settings, bank, run folder) of the command, every input checked."""
    profile: Profile = args.profile
    cfg = scheduler_config(profile, **overrides(args, SchedulerConfig))
    bank = profile_bank(profile, args.bank, build=build_bank)
    if not bank.exists():
        raise FileNotFoundError(f"{bank}: bank file not found (build it with `make curves PROFILE={profile.name}`)")
    predictor_digest(cfg.predictor_spec())  # an FM run needs its exported predictor now, not an hour in
    return cfg, bank, Path(args.out) if args.out else default_out(profile, cfg)

def cmd_train(args: argparse.Namespace) -> None:
    cfg, bank, out = planned_run(args, build_bank=True)
    policy = train(cfg, training_env(cfg, args.profile, bank), out, run_name=args.run_name or out.name,
                   fresh=args.fresh, tags={"profile": args.profile.name})
    print(f"policy: {policy}")

def cmd_submit(args: argparse.Namespace) -> None:
    profile: Profile = args.profile
    cfg, bank, out = planned_run(args, build_bank=False)
    address = check_cluster(args.address)
    ensure_experiment(EXPERIMENT, args.mlflow_uri)  # created here, with this checkout's artifact folder
    named = profile.path.parent.resolve() == PROFILE_DIR.resolve()
    argv = ["--profile", profile.name if named else normal_path(profile.path), "--bank", normal_path(bank),
            "--out", normal_path(out), "--run-name", args.run_name or out.name,
            *(["--fresh"] if args.fresh else [])]
    # The settings given, with the predictor's path in its normal form (the job runs elsewhere).
    given = {k: v for k, v in overrides(args, SchedulerConfig).items() if k != "fm_path"}
    argv += to_argv({**given, **({"fm_path": cfg.fm_path} if cfg.predictor in FM_FOLDER else {})})
    job_id, status = submit_command("train-scheduler", argv, address=address, wait=args.wait, timeout_s=args.timeout,
                                     mlflow_uri=args.mlflow_uri)
    print(f"job {job_id}: {status}")
    if args.wait and status != "SUCCEEDED":
        sys.exit(1)

def register(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("train-scheduler", parents=[common], help="train the MAT scheduler with PPO (RLlib)")
    add_train_arguments(p)
    p.set_defaults(func=cmd_train, outputs=("out",))

    p = subparsers.add_parser("submit-scheduler", parents=[common], help="submit scheduler training as a Ray job")
    add_train_arguments(p)
    p.add_argument("--address", help="Ray dashboard address (default: $RAY_ADDRESS)")
    p.add_argument("--mlflow-uri", help="tracking URI for the job (default: this side's)")
    p.add_argument("--wait", action="store_true", help="poll until the job ends, echoing its logs")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="seconds to wait with --wait")
    p.set_defaults(func=cmd_submit, outputs=("out",))

