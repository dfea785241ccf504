"""Workload calibration scan: how far apart can the classic allocators and the bound be?

For each workload setting (demand range, window factor, unreachable share,
demands sized to the time left or not) it runs FIFO, EDF, LARA (WLS), LARA-FM
(with --fm), LARA with the true remaining demand and the Oracle bound on the
same sampled ID *validation* episodes (never test) and prints a Markdown
table. Three quantities matter for stage two:

- Oracle − LARA: the most any scheduler can gain over LARA (the bound holds
  for every policy), so a learned scheduler's margin over LARA is below it;
- LARA(true demand) − LARA: what a perfect predictor gives LARA;
- LARA-FM − LARA: what the trained predictor gives LARA.

    python experiments/calibrate_workload.py --episodes 12 \
        --fm artifacts/predictor/default/predictor --out reports/calibration
"""

from __future__ import annotations

import argparse
import itertools
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mara_env.env import DEFAULT_BANK, EnvConfig, load_curves
from mara_env.workload import WorkloadConfig, sample_episode
from mara_rl.evaluate import Method, builtin_methods, evaluate_method

COLUMNS = {"fifo": "FIFO", "edf": "EDF", "lara": "LARA", "lara_fm": "LARA-FM", "lara_oracle": "LARA true",
           "oracle": "Oracle"}


@dataclass(frozen=True)
class Grid:
    """The settings scanned: every combination of these."""

    demand: tuple[tuple[int, int], ...] = ((30, 150), (50, 230), (80, 280), (150, 290))
    window: tuple[tuple[float, float], ...] = ((1.3, 2.4), (1.1, 1.8), (0.9, 1.5))
    unreachable: tuple[float, ...] = (0.05, 0.2)
    fit_horizon: tuple[bool, ...] = (False, True)

    def workloads(self) -> list[WorkloadConfig]:
        return [WorkloadConfig(target_lo=lo, target_hi=hi, window_lo=wlo, window_hi=whi, unreachable_frac=u,
                               fit_horizon=fit)
                for fit, (lo, hi), (wlo, whi), u in itertools.product(self.fit_horizon, self.demand, self.window,
                                                                      self.unreachable)]


def scan(workloads: list[WorkloadConfig], bank: Path, load: float, episodes: int, seed: int,
         methods: dict[str, Method]) -> list[dict]:
    curves = load_curves(bank, "id", "val")
    rows = []
    for wl in workloads:
        cfg = EnvConfig(split="val", arrival_prob=load, workload=wl, bank=str(bank))
        rng = np.random.default_rng(seed)
        sampled = [[sample_episode(curves, cfg.horizon, load, wl, rng) for _ in range(episodes)]]
        row: dict = {"workload": wl}
        for name in methods:
            out = evaluate_method(methods[name], cfg, sampled)
            row[name] = 100 * float(np.mean(out["per_root"][0]))
            if name == "edf":
                row["utilisation"] = 100 * out["diagnostics"]["utilisation"]
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def header(names: list[str]) -> str:
    cols = ["demand n_t", "window ×n_t", "unreachable", "fits horizon", *(COLUMNS[m] for m in names),
            "utilisation", "Oracle − LARA", "true − LARA", *(["FM − LARA"] if "lara_fm" in names else [])]
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def format_row(row: dict) -> str:
    wl: WorkloadConfig = row["workload"]
    gaps = [row["oracle"] - row["lara"], row["lara_oracle"] - row["lara"]]
    gaps += [row["lara_fm"] - row["lara"]] if "lara_fm" in row else []
    return (f"| {wl.target_lo}–{wl.target_hi} | {wl.window_lo}–{wl.window_hi} | {wl.unreachable_frac:.2f} | "
            f"{'yes' if wl.fit_horizon else 'no'} | "
            + " | ".join(f"{row[m]:.1f}" for m in COLUMNS if m in row)
            + f" | {row['utilisation']:.1f} | " + " | ".join(f"{g:.1f}" for g in gaps) + " |")


def band_summary(rows: list[dict], fit: bool) -> str:
    """How much room the settings with the Oracle bound in DESIGN's 65–75% band leave."""
    in_band = [r for r in rows if 65 <= r["oracle"] <= 75]
    what = "Demands sized to the time left" if fit else "Demands not sized to the time left"
    if not in_band:
        return f" {what}: no setting with the Oracle bound in 65–75%."
    return (f" {what}: {len(in_band)} settings with the Oracle bound in 65–75%; largest Oracle − LARA "
            f"among them {max(r['oracle'] - r['lara'] for r in in_band):.1f} points, largest LARA true − LARA "
            f"{max(r['lara_oracle'] - r['lara'] for r in in_band):.1f}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bank", type=Path, default=DEFAULT_BANK)
    parser.add_argument("--load", type=float, default=0.04)
    parser.add_argument("--episodes", type=int, default=12)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--fm", type=Path, help="trained FM predictor folder: adds LARA-FM")
    parser.add_argument("--out", type=Path, help="folder for calibration.md")
    args = parser.parse_args()
    available = builtin_methods(str(args.fm) if args.fm else None)
    methods = {m: available[m] for m in COLUMNS if m in available}  # lara_fm only with --fm
    names = list(methods)
    print(header(names))
    grid = Grid()
    rows = scan(grid.workloads(), args.bank, args.load, args.episodes, args.seed, methods)
    summary = f"\nID val, p = {args.load}, {args.episodes} episodes per setting." + "".join(
        band_summary([r for r in rows if r["workload"].fit_horizon == fit], fit) for fit in grid.fit_horizon)
    print(summary)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table = "\n".join([header(names), *map(format_row, rows)])
        (args.out / "calibration.md").write_text(f"# Workload calibration scan\n\n{table}\n{summary}\n")
        defaults = asdict(WorkloadConfig())
        print(f"wrote {args.out / 'calibration.md'} (current defaults: {defaults})")


if __name__ == "__main__":
    main()
