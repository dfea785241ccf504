"""Probe: how far do forecasts from the cluster's own history take the teacher?

The FM predictor sees a task's prefix, batch size and learning rate, never
what kind of job it is. A cluster usually knows more: the job's kind and the
loss curves of earlier runs of that kind. `HistoryPredictor`
(mara_fm/predictors/history.py) reads the remaining demand off such runs,
the profile's history bank (`[history_bank]`: fresh runs of every family,
none of them a curve the evaluation scores).

Its number of neighbours k and its window are chosen here, on ID validation
episodes only (the first table); the second table scores that one setting
on the frozen test episodes of the evaluation (reported, never chosen on).
The evaluation's history methods (`lara_history_optimistic`, `llf_history`)
run the predictor's defaults, which this probe's choice set.

The profile's [env] must set optimistic_quantile. Run from the project root
(FM: the profile's exported predictor unless --fm):

    python -m experiments.probes.history_probe

Writes experiments/probes/results/history_probe.md, or into --out.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from experiments.probes.common import probe_parser, save_table, success
from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig
from mara_fm.build_bank import ensure_history_bank
from mara_fm.predictors import FMPredictor, HistoryPredictor
from mara_fm.predictors.history import history_pool
from mara_rl.evaluate import pooled_episodes

# (k, window) settings compared on ID validation; None: the whole observed prefix.
SETTINGS = ((5, None), (10, None), (5, 20), (5, 40), (10, 40), (20, 40))


def parse_settings(text: str) -> list[tuple[int, int | None]]:
    """`K:WINDOW,...` (WINDOW `all`: the whole prefix) → [(k, window or None)]."""
    settings = []
    for item in comma_list(text, "--settings"):
        k, _, window = item.partition(":")
        if not k.isdigit() or not (window == "all" or window.isdigit()):
            raise ConfigError(f"--settings entry {item!r} should be K:WINDOW, WINDOW a number or 'all'")
        settings.append((int(k), None if window == "all" else int(window)))
    return settings


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True, roots=True)
    parser.add_argument("--settings", default=",".join(f"{k}:{w or 'all'}" for k, w in SETTINGS),
                        help="(k, window) settings compared on ID val, as K:WINDOW,...")
    args = parser.parse_args(argv)

    profile = Profile.load(args.profile)
    base = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank))
    if base.optimistic_quantile is None:
        raise ConfigError(f"profile {profile.name!r} has no [env] optimistic_quantile: the teacher needs it")
    settings = parse_settings(args.settings)
    if not settings:
        parser.error("--settings names no setting")
    fm = FMPredictor.load(args.fm or profile.paths.predictor)

    cfg = dataclasses.replace(base, task_set="id", split="val")
    episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
    history_bank = ensure_history_bank(profile)
    if history_bank is None:
        raise ConfigError(f"profile {profile.name!r} has no [history_bank]: the history predictor's runs")
    pool = history_pool(history_bank)
    with torch_threads(1):
        lines = [f"Teacher (`lara_optimistic`) success (%) on {len(episodes)} ID validation episodes, "
                 f"p = {cfg.arrival_prob}: FM {success(cfg, episodes, fm):.2f}, true demand "
                 f"{success(cfg, episodes, 'oracle'):.2f}; with the history predictor "
                 f"({len(pool)} finished runs):", "", "| k | window | history |", "|---|---|---|"]
        scores = {}
        for k, window in settings:
            scores[k, window] = success(cfg, episodes, HistoryPredictor(pool, k, window))
            lines.append(f"| {k} | {window or 'all'} | {scores[k, window]:.2f} |")
            print(lines[-1], flush=True)
    k, window = max(scores, key=scores.get)
    lines += ["", f"Best on validation: k = {k}, window = {window or 'all'} "
              "(mara_fm/predictors/history.py's NEIGHBOURS and WINDOW)."]
    return save_table(lines, args.out, "history_probe.md")


if __name__ == "__main__":
    main()
