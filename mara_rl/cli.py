"""The `mara` command line: one subcommand per stage of the pipeline.

Every subcommand takes `--profile` (parsed once, here) and `--debug`. Any
failure ends in one line naming its cause; `--debug` shows the traceback.
Output folders are checked for writing before any work starts.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.kernels import pin_kernels
from mara_common.paths import normal_path
from mara_common.profile import Profile
from mara_common.tracking import check_reachable, tracking_uri
from mara_env.env import EnvConfig
from mara_fm import commands as predictor_commands
from mara_fm.build_bank import profile_bank
from mara_live.config import LiveConfig
from mara_rl import live_commands, pipeline, scheduler_commands
from mara_rl.bench import run_bench
from mara_rl.evaluate import EvalConfig, evaluate
from mara_rl.live_commands import live_env_config, live_method
from mara_rl.methods import builtin_methods, learned, parse_policies, unavailable
from mara_rl.records import markdown_table
from mara_rl.scheduler_config import scheduler_config, training_env

UNTRACKED = ("curves", "bench")  # the commands that log nothing to MLflow


def _loads(text: str) -> list[float]:
    loads = comma_list(text, "--load", float)
    if not loads or any(not 0.0 <= p <= 1.0 for p in loads):
        raise ConfigError(f"--load {text!r}: arrival probabilities must lie in [0, 1]")
    return loads


def cmd_evaluate(args: argparse.Namespace) -> None:
    profile: Profile = args.profile
    bank = profile_bank(profile, args.bank)
    env_cfg = profile.section(EnvConfig, "env", bank=str(bank))
    eval_cfg = profile.section(EvalConfig, "evaluation", roots=args.roots, episodes_per_root=args.episodes,
                               split=args.split, workers=args.workers)
    available = builtin_methods(normal_path(args.fm) if args.fm else None, env_cfg.view_options,
                                normal_path(args.history) if args.history else None)
    names = list(dict.fromkeys(comma_list(args.methods, "--methods")))
    for (name, seed), path in parse_policies(args.policies).items():
        key = name if seed is None else f"{name}@{seed}"
        available[key] = learned(name, path, seed)
        if key not in names:  # naming it in --methods as well must not run it twice
            names.append(key)
    missing = unavailable(names, available)
    if missing:
        raise ConfigError(f"cannot run: {missing}")
    records = evaluate([available[m] for m in names], comma_list(args.task_set, "--task-set"), _loads(args.load), bank, env_cfg,
                       eval_cfg, scenario=args.scenario, out_dir=Path(args.out), log_mlflow=not args.no_mlflow,
                       tags={"profile": profile.name, "evaluation": Path(args.out).name})
    print(markdown_table(records))
    print(f"results: {Path(args.out) / 'results.json'}")


def cmd_bench(args: argparse.Namespace) -> None:
    profile: Profile = args.profile
    bank = profile_bank(profile, args.bank)
    env_cfg = profile.section(EnvConfig, "env", bank=str(bank), split="test")
    sched = scheduler_config(profile, predictor="fm" if args.fm else "wls", fm_path=args.fm)
    training = None if args.skip_training else (sched, training_env(sched, profile, bank))
    live = None
    if args.live:
        live_cfg = replace(profile.section(LiveConfig, "live"), kill_at=-1, show_every=0)
        live_env = live_env_config(profile, bank, live_cfg)
        live = (live_method(profile, live_env, args.live), live_env, live_cfg)
    run_bench(env_cfg, steps=args.steps, bank_rate=not args.skip_bank, fm_path=args.fm, training=training,
              mat=sched.mat, live=live, history_path=args.history)


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path the command was given can be written, before any work starts
    (`outputs`: the flags naming a folder; `output_files`: those naming a file)."""
    named = [(name, False) for name in getattr(args, "outputs", ())]
    named += [(name, True) for name in getattr(args, "output_files", ())]
    for name, is_file in named:
        value = getattr(args, name, None)
        if not value:
            continue
        path = Path(value)
        folder = path.parent if is_file else path
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: cannot write there ({exc.strerror or exc})") from None


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", default="default", help="profile name in experiments/profiles/ or a TOML path")
    common.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser = argparse.ArgumentParser(prog="mara", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("evaluate", parents=[common], help="run allocators on frozen episodes")
    p.add_argument("--methods", default="fifo,edf,lara,oracle")
    p.add_argument("--task-set", default="id", help="comma-separated: id,rl_ood,vit_ood")
    p.add_argument("--load", default="0.04", help="comma-separated arrival probabilities")
    p.add_argument("--scenario", choices=["default", "stress"], default="default")
    p.add_argument("--split", choices=["test", "val"], help="episodes from test (default) or "
                   "validation curves; choices made on results should use val")
    p.add_argument("--out", required=True)
    p.add_argument("--bank")
    p.add_argument("--fm", help="exported FM predictor (enables the methods that read FM)")
    p.add_argument("--history", help="history bank (enables the methods that read earlier runs of a job's kind)")
    p.add_argument("--policies", help="learned methods as NAME[@SEED]=POLICY_DIR,... "
                   "(e.g. mara=artifacts/scheduler/default-seed0/policy)")
    p.add_argument("--roots", type=int)
    p.add_argument("--episodes", type=int, help="episodes per evaluation root")
    p.add_argument("--workers", type=int, help="evaluation processes (default: the profile's; 0: one per CPU core)")
    p.add_argument("--no-mlflow", action="store_true")
    p.set_defaults(func=cmd_evaluate, outputs=("out",))

    p = sub.add_parser("bench", parents=[common], help="print throughput figures")
    p.add_argument("--bank")
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--skip-bank", action="store_true", help="skip the bank build-rate benchmark")
    p.add_argument("--skip-training", action="store_true", help="skip the PPO training-throughput benchmark")
    p.add_argument("--fm", help="also time the env with this exported FM predictor inside")
    p.add_argument("--history", help="also time the env with the history predictor on this history bank")
    p.add_argument("--live", metavar="METHOD", help="also time the scheduler's overhead per tick of a live "
                   "run on Ray with this method (e.g. mara; needs the profile's [live] section)")
    p.set_defaults(func=cmd_bench)

    predictor_commands.register(sub, common)
    scheduler_commands.register(sub, common)
    pipeline.register(sub, common)
    live_commands.register(sub, common)
    return parser


def describe(exc: BaseException) -> str:
    """One line naming the cause: the message of an expected error, else its type too."""
    text = " ".join(str(exc).split()) or exc.__class__.__name__
    expected = (ConfigError, FileNotFoundError, ValueError, PermissionError)
    return text if isinstance(exc, expected) else f"{exc.__class__.__name__}: {text}"


def _stop(signum: int, frame: object) -> None:
    """SIGTERM ends a command as Ctrl-C does: cleanly, so Ray's workers stop with it."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
    try:
        pin_kernels()  # before any torch or MKL operation of the run (mara_common/kernels.py)
        args.profile = Profile.load(args.profile)
        check_outputs(args)
        if args.command not in UNTRACKED and not getattr(args, "no_mlflow", False):
            check_reachable(getattr(args, "mlflow_uri", None) or tracking_uri())  # before the work
        args.func(args)
    except KeyboardInterrupt:
        print(f"mara {args.command}: interrupted (a rerun resumes where it can)", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        if args.debug:
            raise
        print(f"mara {args.command}: error: {describe(exc)} (--debug shows the traceback)", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
