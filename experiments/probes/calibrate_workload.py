"""Workload calibration scan: how far apart can the classic allocators and the bound be?

For each workload setting (demand range, window factor, unreachable share,
demands sized to the time left or not) it runs FIFO, EDF, LARA (WLS), LARA-FM
(with --fm), LARA with the true remaining demand and the Oracle bound on the
same sampled ID *validation* episodes (never test) and writes a Markdown
table. Three quantities matter for stage two:

- Oracle − LARA: the most any scheduler can gain over LARA (the bound holds
  for every policy), so a learned scheduler's margin over LARA is below it;
- LARA(true demand) − LARA: what a perfect predictor gives LARA;
- LARA-FM − LARA: what the trained predictor gives LARA.

Every setting not scanned comes from the profile's [env] (its workload
included). Run from the project root:

    python -m experiments.probes.calibrate_workload --episodes 12 --fm artifacts/predictor/default/predictor

Writes experiments/probes/results/calibrate_workload.md, or into --out.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.probes.common import probe_parser, save_table
from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, load_curves
from mara_env.workload import WorkloadConfig, family_reference, sample_episode
from mara_rl.evaluate import evaluate_method
from mara_rl.methods import Method, builtin_methods

COLUMNS = {"fifo": "FIFO", "edf": "EDF", "lara": "LARA", "lara_fm": "LARA-FM", "lara_oracle": "LARA true",
           "oracle": "Oracle"}


@dataclass(frozen=True)
class Grid:
    """The settings scanned: every combination of these."""

    demand: tuple[tuple[int, int], ...] = ((30, 150), (50, 230), (80, 280), (150, 290))
    window: tuple[tuple[float, float], ...] = ((1.3, 2.4), (1.1, 1.8), (0.9, 1.5))
    unreachable: tuple[float, ...] = (0.05, 0.2)
    fit_horizon: tuple[bool, ...] = (False, True)

    def workloads(self, base: WorkloadConfig) -> list[WorkloadConfig]:
        """`base` with each combination in place."""
        return [dataclasses.replace(base, target_lo=lo, target_hi=hi, window_lo=wlo, window_hi=whi,
                                    unreachable_frac=u, fit_horizon=fit)
                for fit, (lo, hi), (wlo, whi), u in itertools.product(self.fit_horizon, self.demand, self.window,
                                                                      self.unreachable)]


def scan(base: EnvConfig, workloads: list[WorkloadConfig], episodes: int, seed: int,
         methods: dict[str, Method]) -> list[dict]:
    """Each method's mean success (%) per workload, on the same sampled ID val episodes."""
    curves = load_curves(base.bank_path, "id", "val")
    rows = []
    for wl in workloads:
        cfg = dataclasses.replace(base, task_set="id", split="val", workload=wl)
        reference = family_reference(curves, wl.eps_quantile) if wl.threshold_source == "family" else None
        rng = np.random.default_rng(seed)
        sampled = [[sample_episode(curves, cfg.horizon, cfg.arrival_prob, wl, rng, reference)
                    for _ in range(episodes)]]
        row: dict = {"workload": wl}
        for name, method in methods.items():
            out = evaluate_method(method, cfg, sampled)
            row[name] = 100 * float(np.mean(out["per_root"][0]))
            if name == "edf":
                row["utilisation"] = 100 * out["diagnostics"]["utilisation"]
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def header(names: list[str]) -> list[str]:
    cols = ["demand n_t", "window ×n_t", "unreachable", "fits horizon", *(COLUMNS[m] for m in names),
            "utilisation", "Oracle − LARA", "true − LARA", *(["FM − LARA"] if "lara_fm" in names else [])]
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def format_row(row: dict) -> str:
    wl: WorkloadConfig = row["workload"]
    gaps = [row["oracle"] - row["lara"], row["lara_oracle"] - row["lara"]]
    gaps += [row["lara_fm"] - row["lara"]] if "lara_fm" in row else []
    return (f"| {wl.target_lo}–{wl.target_hi} | {wl.window_lo}–{wl.window_hi} | {wl.unreachable_frac:.2f} | "
            f"{'yes' if wl.fit_horizon else 'no'} | "
            + " | ".join(f"{row[m]:.1f}" for m in COLUMNS if m in row)
            + f" | {row['utilisation']:.1f} | " + " | ".join(f"{g:.1f}" for g in gaps) + " |")


def band_summary(rows: list[dict], fit: bool) -> str:
    """How much room the settings with the Oracle bound in docs/design.md's 65–75% band (§3) leave."""
    in_band = [r for r in rows if 65 <= r["oracle"] <= 75]
    what = "Demands sized to the time left" if fit else "Demands not sized to the time left"
    if not in_band:
        return f" {what}: no setting with the Oracle bound in 65–75%."
    return (f" {what}: {len(in_band)} settings with the Oracle bound in 65–75%; largest Oracle − LARA "
            f"among them {max(r['oracle'] - r['lara'] for r in in_band):.1f} points, largest LARA true − LARA "
            f"{max(r['lara_oracle'] - r['lara'] for r in in_band):.1f}.")


def pairs(text: str, kind: type, flag: str) -> tuple[tuple, ...]:
    """`LO-HI,LO-HI,...` (the value of `flag`) → ((lo, hi), ...)."""
    out = []
    for item in comma_list(text, flag):
        lo, _, hi = item.partition("-")
        try:
            out.append((kind(lo), kind(hi)))
        except ValueError:
            raise ConfigError(f"{flag}: {item!r} should be LO-HI ({kind.__name__}s)") from None
    return tuple(out)


def yes_no(text: str) -> tuple[bool, ...]:
    """`no`, `yes` or `no,yes` → the fit_horizon values scanned."""
    words = comma_list(text, "--fit-horizon")
    if not words or set(words) - {"no", "yes"}:
        raise ConfigError(f"--fit-horizon takes no, yes or no,yes; got {text!r}")
    return tuple(w == "yes" for w in words)


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__)
    grid = Grid()
    parser.add_argument("--load", type=float, help="arrival probability (default: the profile's)")
    parser.add_argument("--episodes", type=int, default=12, help="sampled episodes per setting")
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--fm", type=Path, help="exported FM predictor: adds LARA-FM")
    parser.add_argument("--demand", default=",".join(f"{lo}-{hi}" for lo, hi in grid.demand),
                        help="target demand ranges scanned, LO-HI,...")
    parser.add_argument("--window", default=",".join(f"{lo}-{hi}" for lo, hi in grid.window),
                        help="window factor ranges scanned, LO-HI,...")
    parser.add_argument("--unreachable", default=",".join(map(str, grid.unreachable)),
                        help="unreachable shares scanned, comma-separated")
    parser.add_argument("--fit-horizon", default="no,yes", help="scan demands sized to the time left: no, yes or no,yes")
    args = parser.parse_args(argv)

    grid = Grid(pairs(args.demand, int, "--demand"), pairs(args.window, float, "--window"),
                tuple(comma_list(args.unreachable, "--unreachable", float)), yes_no(args.fit_horizon))
    profile = Profile.load(args.profile)
    base = profile.section(EnvConfig, "env", bank=str(args.bank or profile.paths.bank), arrival_prob=args.load)
    available = builtin_methods(str(args.fm.resolve()) if args.fm else None, base.view_options)
    methods = {m: available[m] for m in COLUMNS if m in available}  # lara_fm only with --fm
    print("\n".join(header(list(methods))))
    with torch_threads(1):
        rows = scan(base, grid.workloads(base.workload), args.episodes, args.seed, methods)
    summary = f"ID val, p = {base.arrival_prob}, {args.episodes} episodes per setting." + "".join(
        band_summary([r for r in rows if r["workload"].fit_horizon == fit], fit) for fit in grid.fit_horizon)
    print(summary)
    lines = ["# Workload calibration scan", "", *header(list(methods)), *map(format_row, rows), "", summary,
             "", f"The profile's workload: {dataclasses.asdict(base.workload)}."]
    return save_table(lines, args.out, "calibrate_workload.md")


if __name__ == "__main__":
    main()
