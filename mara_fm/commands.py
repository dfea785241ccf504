"""Stage-one subcommands of the `mara` CLI: `curves`, `train-predictor`, `eval-predictor`.

`register(subparsers)` adds them; each handler receives the parsed arguments
with `args.profile` already loaded (`mara_common.profile.Profile`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mara_fm.build_bank import bank_spec, build_bank, ensure_history_bank, profile_bank
from mara_fm.eval_predictor import EVAL_FILE, markdown_table, run_eval
from mara_fm.train_predictor import train_predictor


def cmd_curves(args: argparse.Namespace) -> None:
    which = "wide" if args.wide else "history" if args.history else "main"
    cfg, default, families = bank_spec(args.profile, which, workers=args.workers)
    path = build_bank(cfg, Path(args.out) if args.out else default, progress=True, fresh=args.fresh,
                      families=families)
    print(f"bank written: {path}")


def cmd_train_predictor(args: argparse.Namespace) -> None:
    result = train_predictor(args.profile, args.bank, args.out, resume=not args.fresh,
                             max_epochs=args.max_epochs, seed=args.seed)
    print(f"predictor: {result.predictor_path}")


def cmd_eval_predictor(args: argparse.Namespace) -> None:
    paths = args.profile.paths
    bank = profile_bank(args.profile, args.bank)
    out = Path(args.out) if args.out else paths.predictor_report
    # The history runs are of the profile's families: scored on the profile's own bank only.
    history = ensure_history_bank(args.profile) if args.bank is None else None
    records = run_eval(args.predictor_path or paths.predictor, bank, out, tracking=not args.no_mlflow,
                       history_bank=history)
    print(markdown_table(records))
    print(f"results: {out / EVAL_FILE}")


def register(subparsers: Any, common: argparse.ArgumentParser) -> None:
    """Add the stage-one commands; `common` carries the flags every command has (--profile)."""
    p = subparsers.add_parser("curves", parents=[common], help="build the curve bank from real training runs")
    p.add_argument("--out", help="bank path (default data/banks/<profile>.parquet, <profile>-wide.parquet "
                   "or <profile>-history.parquet)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--wide", action="store_true",
                       help="build the wide bank ([wide_bank]): the extra families FM may train and be selected on")
    which.add_argument("--history", action="store_true",
                       help="build the history bank ([history_bank]): finished runs the history predictor reads")
    p.add_argument("--workers", type=int, help="processes (default: one per core)")
    p.add_argument("--fresh", action="store_true", help="discard the chunks of an earlier build first")
    p.set_defaults(func=cmd_curves, output_files=("out",))

    p = subparsers.add_parser("train-predictor", parents=[common],
                              help="train and export the FM predictor (stage one)")
    p.add_argument("--bank", help="bank path (default data/banks/<profile>.parquet, built if missing)")
    p.add_argument("--out", help="output folder (default artifacts/predictor/<profile>)")
    p.add_argument("--fresh", action="store_true", help="start over instead of resuming the checkpoint")
    p.add_argument("--max-epochs", type=int, help="override [predictor] max_epochs")
    p.add_argument("--seed", type=int, help="override [predictor] seed")
    p.set_defaults(func=cmd_train_predictor, outputs=("out",))

    p = subparsers.add_parser("eval-predictor", parents=[common],
                              help="FM vs WLS (and, on the profile's own bank, the history predictor) on every "
                                   "test task set of a bank")
    p.add_argument("--predictor-path", help="exported predictor (default artifacts/predictor/<profile>/predictor)")
    p.add_argument("--bank", help="any bank file (default data/banks/<profile>.parquet; another bank is scored "
                   "without the history predictor, whose runs are of the profile's families)")
    p.add_argument("--out", help="report folder (default reports/predictor/<profile>)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.set_defaults(func=cmd_eval_predictor, outputs=("out",))
