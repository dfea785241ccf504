"""The `mara` command line: one subcommand per stage of the pipeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mara_fm import commands as predictor_commands
from mara_fm.build_bank import default_bank_path
from mara_fm.profile import ConfigError, section_config
from mara_rl import pipeline, scheduler_commands


def cmd_curves(args: argparse.Namespace) -> None:
    from mara_fm.build_bank import BankConfig, build_bank

    cfg = section_config(BankConfig, args.profile, "bank", workers=args.workers)
    out = Path(args.out) if args.out else default_bank_path(args.profile)
    path = build_bank(cfg, out, progress=True)
    print(f"bank written: {path}")


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def cmd_evaluate(args: argparse.Namespace) -> None:
    from mara_env.env import EnvConfig
    from mara_fm.build_bank import BankConfig, ensure_bank
    from mara_rl.evaluate import EvalConfig, builtin_methods, evaluate, learned, markdown_table

    bank = Path(args.bank) if args.bank else default_bank_path(args.profile)
    if not args.bank:
        ensure_bank(section_config(BankConfig, args.profile, "bank"), bank)
    env_cfg = section_config(EnvConfig, args.profile, "env", bank=str(bank))
    eval_cfg = section_config(EvalConfig, args.profile, "evaluation", roots=args.roots,
                              episodes_per_root=args.episodes, split=args.split)
    available = builtin_methods(args.fm, env_cfg.view_options)
    names = list(dict.fromkeys(_csv(args.methods)))
    for (name, seed), path in parse_policies(args.policies).items():
        key = name if seed is None else f"{name}@{seed}"
        available[key] = learned(name, path, seed)
        if key not in names:  # naming it in --methods as well must not run it twice
            names.append(key)
    unknown = [m for m in names if m not in available]
    if unknown:
        raise ConfigError(f"unknown method(s) {unknown}; available: {sorted(available)}"
                          + ("" if args.fm else " (lara_fm needs --fm PATH)"))
    records = evaluate([available[m] for m in names], _csv(args.task_set),
                       [float(x) for x in _csv(args.load)], bank, env_cfg, eval_cfg,
                       scenario=args.scenario, out_dir=Path(args.out), log_mlflow=not args.no_mlflow)
    print(markdown_table(records))
    print(f"results: {Path(args.out) / 'results.json'}")


def parse_policies(text: str | None) -> dict[tuple[str, int | None], str]:
    """`NAME[@SEED]=POLICY_DIR,...` → {(name, training seed or None): dir}.

    The seed lets several training runs of one method enter the report as
    that method's seeds (e.g. `mara@1=...,mara@2=...` beside the pipeline's seed 0).
    """
    policies = {}
    for item in _csv(text or ""):
        key, _, path = item.partition("=")
        name, at, seed = key.partition("@")
        if not name or not path or (at and not seed.isdigit()):
            raise ConfigError(f"--policies entry {item!r} should be NAME=POLICY_DIR or NAME@SEED=POLICY_DIR")
        policies[(name, int(seed) if at else None)] = path
    return policies


def cmd_bench(args: argparse.Namespace) -> None:
    from mara_env.env import EnvConfig
    from mara_fm.build_bank import BankConfig, ensure_bank
    from mara_rl.bench import run_bench

    bank = Path(args.bank) if args.bank else default_bank_path(args.profile)
    if not args.bank:
        ensure_bank(section_config(BankConfig, args.profile, "bank"), bank)
    env_cfg = section_config(EnvConfig, args.profile, "env", bank=str(bank), split="test")
    from mara_rl.train_scheduler import SchedulerConfig, training_env

    sched = section_config(SchedulerConfig, args.profile, "scheduler", fm_path=args.fm,
                           predictor="fm" if args.fm else "wls")
    training = None if args.skip_training else (sched, training_env(sched, args.profile, bank))
    run_bench(env_cfg, steps=args.steps, bank_rate=not args.skip_bank, fm_path=args.fm, training=training,
              mat=sched.mat_config())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mara", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("curves", help="build the curve bank from real training runs")
    p.add_argument("--profile", default="default")
    p.add_argument("--out", help="bank path (default data/banks/<profile>.parquet)")
    p.add_argument("--workers", type=int, help="processes (default: one per core)")
    p.set_defaults(func=cmd_curves)

    p = sub.add_parser("evaluate", help="run allocators on frozen episodes")
    p.add_argument("--methods", default="fifo,edf,lara,oracle")
    p.add_argument("--task-set", default="id", help="comma-separated: id,rl_ood,vit_ood")
    p.add_argument("--load", default="0.04", help="comma-separated arrival probabilities")
    p.add_argument("--scenario", choices=["default", "stress"], default="default")
    p.add_argument("--split", choices=["test", "val"], help="episodes from test (default) or "
                   "validation curves; choices made on results should use val")
    p.add_argument("--out", required=True)
    p.add_argument("--profile", default="default")
    p.add_argument("--bank")
    p.add_argument("--fm", help="exported FM predictor (enables lara_fm, and lara_fm_optimistic "
                   "when the profile sets [env] optimistic_quantile)")
    p.add_argument("--policies", help="learned methods as NAME[@SEED]=POLICY_DIR,... "
                   "(e.g. mara=artifacts/scheduler/default-fm-beta0.1-seed0-imitation32-lara_optimistic-dagger2/policy)")
    p.add_argument("--roots", type=int)
    p.add_argument("--episodes", type=int, help="episodes per evaluation root")
    p.add_argument("--no-mlflow", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("bench", help="print throughput figures")
    p.add_argument("--profile", default="default")
    p.add_argument("--bank")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--skip-bank", action="store_true", help="skip the bank build-rate benchmark")
    p.add_argument("--skip-training", action="store_true", help="skip the PPO training-throughput benchmark")
    p.add_argument("--fm", help="also time the env with this exported FM predictor inside")
    p.set_defaults(func=cmd_bench)

    predictor_commands.register(sub)
    scheduler_commands.register(sub)
    pipeline.register(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as exc:
        print(f"mara {args.command}: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
