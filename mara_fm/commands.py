"""Stage-one subcommands for the `mara` CLI: `train-predictor` and `eval-predictor`.

`register(subparsers)` adds both; each sets `func(args)` like the other
subcommands of `mara_rl.cli`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mara_fm.profile import PROJECT_ROOT, profile_path


def cmd_train_predictor(args: argparse.Namespace) -> None:
    from mara_fm.train_predictor import train_predictor

    result = train_predictor(args.profile, args.bank, args.out, resume=not args.no_resume,
                             max_epochs=args.max_epochs, seed=args.seed)
    print(f"predictor: {result.predictor_path}")


def cmd_eval_predictor(args: argparse.Namespace) -> None:
    from mara_fm.build_bank import BankConfig, default_bank_path, ensure_bank
    from mara_fm.eval_predictor import EVAL_FILE, markdown_table, run_eval
    from mara_fm.profile import section_config
    from mara_fm.train_predictor import default_out_dir

    bank = Path(args.bank) if args.bank else default_bank_path(args.profile)
    if not args.bank:
        ensure_bank(section_config(BankConfig, args.profile, "bank"), bank)
    predictor = args.predictor_path or default_out_dir(args.profile) / "predictor"
    out = Path(args.out) if args.out else PROJECT_ROOT / "reports" / "predictor" / profile_path(args.profile).stem
    records = run_eval(predictor, bank, out, tracking=not args.no_mlflow)
    print(markdown_table(records))
    print(f"results: {out / EVAL_FILE}")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train-predictor", help="train and export the FM predictor (stage one)")
    p.add_argument("--profile", default="default")
    p.add_argument("--bank", help="bank path (default data/banks/<profile>.parquet, built if missing)")
    p.add_argument("--out", help="output folder (default artifacts/predictor/<profile>)")
    p.add_argument("--no-resume", action="store_true", help="start over instead of resuming last.ckpt")
    p.add_argument("--max-epochs", type=int, help="override [predictor] max_epochs")
    p.add_argument("--seed", type=int, help="override [predictor] seed")
    p.set_defaults(func=cmd_train_predictor)

    p = subparsers.add_parser("eval-predictor", help="FM vs WLS on every test task set of a bank")
    p.add_argument("--profile", default="default")
    p.add_argument("--predictor-path", help="exported predictor (default artifacts/predictor/<profile>/predictor)")
    p.add_argument("--bank", help="any bank file (default data/banks/<profile>.parquet)")
    p.add_argument("--out", help="report folder (default reports/predictor/<profile>)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.set_defaults(func=cmd_eval_predictor)
