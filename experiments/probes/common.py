"""What the probes share: where they write, how they write a table, and one replay's
success rate."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from mara_common.profile import Profile
from mara_env.env import EnvConfig, sample_episodes
from mara_env.vector import replay_in_lockstep
from mara_env.workload import Episode
from mara_fm.eval_predictor import Queries, score
from mara_fm.predictors import Predictor
from mara_rl.methods import classic
from mara_rl.scheduler_config import scheduler_config, training_env
from mara_rl.stats import PairedDifference

RESULTS = Path(__file__).resolve().parent / "results"


def probe_parser(doc: str, fm: bool = False, roots: bool = False) -> argparse.ArgumentParser:
    """A probe's parser, described by its docstring's first line, with the flags every probe
    has (--profile, --bank, --out); with `fm`, --fm (the exported FM predictor, by default the
    profile's); with `roots`, --roots and --episodes-per-root (the frozen val episodes)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--profile", default="default", help="run profile: a name or a .toml path")
    parser.add_argument("--bank", type=Path, help="curve bank (default: the profile's)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for the probe's Markdown (default: experiments/probes/results)")
    if fm:
        parser.add_argument("--fm", type=Path, help="exported FM predictor (default: the profile's)")
    if roots:
        parser.add_argument("--roots", type=int, default=5)
        parser.add_argument("--episodes-per-root", type=int, default=8)
    return parser


def told_training_env(profile: Profile, bank: Path | None, hold: int) -> EnvConfig:
    """The scheduler's training env (ID train) told every task's true demand (the `oracle`
    predictor), deciding at events every `hold` steps at most, with no rule hint."""
    return dataclasses.replace(training_env(scheduler_config(profile), profile, bank or profile.paths.bank),
                               predictor="oracle", decision_interval=hold, rule_hint=None)


def add_alternatives_flag(parser: argparse.ArgumentParser) -> None:
    """--alternatives: how many swaps, and as many drops, a search draws at a decision; `all`:
    every swap and every drop, so its choice is a function of the state alone."""
    def count(text: str) -> int | None:
        if text == "all":
            return None
        if not text.isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"a count >= 1 or 'all', not {text!r}")
        return int(text)

    parser.add_argument("--alternatives", type=count, default=3,
                        help="swaps, and as many drops, drawn per decision (a count, or 'all')")


def trainer_val_episodes(profile: Profile, bank: Path, fm: Path | None = None,
                         count: int | None = None) -> tuple[EnvConfig, list[Episode]]:
    """The scheduler trainer's validation env (FM inside, no bursts) and its episodes: the ones
    that pick a run's exported policy, `[scheduler] eval_episodes` (or `count`) from `eval_seed`."""
    cfg = scheduler_config(profile, predictor="fm", fm_path=str(fm) if fm else None)
    env = dataclasses.replace(training_env(cfg, profile, bank), split="val", burst_prob=0.0)
    return env, sample_episodes(env, count or cfg.eval_episodes, cfg.eval_seed)


def table_name(probe: str, profile: Profile, variant: str = "") -> str:
    """`probe[_profile][variant].md`: the default profile's table carries no profile suffix."""
    return probe + ("" if profile.name == "default" else f"_{profile.name}") + variant + ".md"


def save_table(lines: list[str], out: Path, name: str) -> Path:
    """Write a probe's Markdown lines to out/name; returns the file."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return path


def capped_mae(predictor: Predictor, q: Queries) -> float:
    """`predictor`'s capped MAE on the evaluation's queries `q` (eval_predictor.py)."""
    return score(predictor.remaining_batches(q.hist, q.eps, q.horizon), q)["capped_mae"]


def success(cfg: EnvConfig, episodes: list[Episode], predictor: str | Predictor,
            planner: str = "lara_optimistic") -> float:
    """Mean success (%) of allocator `planner` on `episodes`, its env fed by `predictor`."""
    outs = replay_in_lockstep(dataclasses.replace(cfg, predictor=predictor), episodes, classic(planner)())
    return 100 * float(np.mean([o["success_rate"] for o in outs]))


def difference_text(diff: PairedDifference) -> str:
    """A paired difference as the probes' tables show it: mean [low, high], signed, 2 decimals."""
    return f"{diff.mean:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}]"
