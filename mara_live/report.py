"""Seeing a live run: its curves plot, its MLflow run, and the live-versus-simulator table."""

from __future__ import annotations

import json
from math import comb
from pathlib import Path
from typing import Any

import numpy as np

from mara_common.config import ConfigError
from mara_common.paths import write_text_atomic
from mara_common.plotting import plt, save_figure
from mara_common.tracking import mlflow_run
from mara_live.log import LOG
from mara_live.runner import BANK, RESULT, LiveResult, overhead_figures
from mara_live.streams import Stream

LIVE_EXPERIMENT = "mara-live"
TIMELINE_PNG, CURVES_PNG = "timeline.png", "curves.png"


def plot_curves(run_dir: Path, stream: Stream, result: LiveResult) -> Path:
    """Every job's cumulative-average loss over its threshold, log scale: a job succeeds
    where its line reaches 1 (green: it did, grey: it did not)."""
    curves = result.curves
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, (n, job) in enumerate(zip(curves.known.tolist(), stream.jobs, strict=True)):
        if n:
            ax.plot(np.arange(1, n + 1), curves.avg[i, :n] / job.eps, lw=0.8,
                    color="tab:green" if result.succeeded[i] else "0.6")
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("batches trained")
    ax.set_ylabel("cumulative-average loss / target")
    ax.set_title(f"{sum(result.succeeded)} of {len(result.succeeded)} jobs reached their target in time")
    return save_figure(fig, run_dir / CURVES_PNG)


def log_live_run(run_dir: Path, name: str, stream: Stream, result: LiveResult, check: dict[str, Any],
                 tags: dict[str, Any]) -> None:
    """One MLflow run: settings, the success and cost figures, each job's loss curve as a
    metric series (`loss/<job>`), and the plots, log and live bank as artifacts."""
    import mlflow

    curves = result.curves
    with mlflow_run(LIVE_EXPERIMENT, f"{name} {run_dir.name}", {**tags, "method": name}):
        mlflow.log_params({"method": name, "jobs": len(stream.jobs), "horizon": stream.horizon,
                           **{f"stream.{k}": v for k, v in stream.meta.items()}})
        figures = {k: v for k, v in result.stats.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        overhead = {f"overhead_ms_{k}": v for k, v in overhead_figures(result.overhead_ms).items()}
        mlflow.log_metrics({"success_rate": result.success_rate, **overhead, **figures,
                            **{k: float(v) for k, v in check.items()}})
        for cid, losses, n in zip(curves.ids.tolist(), curves.losses, curves.known.tolist(), strict=True):
            metrics = [mlflow.entities.Metric(f"loss/{cid}", float(v), 0, step) for step, v in enumerate(losses[:n])]
            mlflow.MlflowClient().log_batch(mlflow.active_run().info.run_id, metrics=metrics)
        for artifact in (TIMELINE_PNG, CURVES_PNG, LOG, RESULT, BANK):
            if (run_dir / artifact).exists():
                mlflow.log_artifact(str(run_dir / artifact))


def comparison_table(rows: list[dict[str, Any]], intervals: dict[str, dict[str, tuple[float, float]]]) -> str:
    """Per method: live and simulated success (means over streams) and their differences with
    `intervals[method][prediction]` (percentile intervals over streams); then per stream."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = ["| method | live % | sim (stand-ins) % | sim (family) % | live − stand-ins | live − family | streams "
             "| replay exact | node faults | overhead ms/tick | restore ms | batch ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        live, sim, family = (100 * np.mean([r[k] for r in mine]) for k in ("live", "simulated", "simulated_family"))
        overhead, restore, batch = (np.mean([r[k] for r in mine]) for k in ("overhead_ms", "restore_ms", "batch_ms"))
        exact = all(r["replay_exact"] for r in mine)
        gaps = [f"{gap:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
                for gap, (lo, hi) in ((live - sim, intervals[m]["simulated"]),
                                      (live - family, intervals[m]["simulated_family"]))]
        lines.append(f"| {m} | {live:.2f} | {sim:.2f} | {family:.2f} | {gaps[0]} | {gaps[1]} "
                     f"| {len(mine)} | {'yes' if exact else 'NO'} | {sum(r['faults'] for r in mine)} "
                     f"| {overhead:.2f} | {restore:.1f} | {batch:.2f} |")
    lines += ["", "| stream | jobs | " + " | ".join(f"{m} live / stand-ins / family" for m in methods) + " |",
              "|---|---|" + "---|" * len(methods)]
    for seed in dict.fromkeys(r["stream"] for r in rows):
        cells = {r["method"]: r for r in rows if r["stream"] == seed}
        jobs = next(iter(cells.values()))["jobs"]
        lines.append(f"| {seed} | {jobs} | " + " | ".join(
            f"{100 * cells[m]['live']:.1f} / {100 * cells[m]['simulated']:.1f} / {100 * cells[m]['simulated_family']:.1f}"
            for m in methods) + " |")
    return "\n".join(lines)


def paired_differences(rows: list[dict[str, Any]], first: str, other: str, key: str) -> np.ndarray:
    """`first`'s success minus `other`'s on each stream, in stream order (`key`: "live" or a prediction)."""
    by_stream = {(r["stream"], r["method"]): r[key] for r in rows}
    streams = dict.fromkeys(r["stream"] for r in rows)
    return np.array([by_stream[s, first] - by_stream[s, other] for s in streams])


def sign_test_p(ahead: int, behind: int) -> float:
    """Two-sided sign test: the chance of a split at least this uneven among the untied streams
    if either method were as likely to come out ahead on each."""
    n, k = ahead + behind, min(ahead, behind)
    return min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0


def ranking_table(rows: list[dict[str, Any]], intervals: dict[str, dict[str, tuple[float, float]]]) -> str:
    """The first method against each other one: the mean difference over streams live and in the
    family prediction (with `intervals[other][key]`), whether both put the first on the same side,
    and the streams it was ahead of, tied with and behind the other live. Live success moves in
    whole jobs, so two methods that choose alike on most ticks differ on a few streams only; the
    sign test over those says how far their live order is from a coin toss."""
    first, *others = dict.fromkeys(r["method"] for r in rows)
    lines = [f"| {first} − | live | sim (family) | same side | streams ahead / tied / behind (live) | sign test p |",
             "|---|---|---|---|---|---|"]
    for other in others:
        live, family = (paired_differences(rows, first, other, key) for key in ("live", "simulated_family"))
        cells = [f"{100 * d.mean():+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]"
                 for d, (lo, hi) in ((live, intervals[other]["live"]), (family, intervals[other]["simulated_family"]))]
        side = "tie" if 0.0 in (live.mean(), family.mean()) else "yes" if live.mean() * family.mean() > 0 else "NO"
        ahead, behind = int((live > 0).sum()), int((live < 0).sum())
        lines.append(f"| {other} | {cells[0]} | {cells[1]} | {side} | {ahead} / {len(live) - ahead - behind} / "
                     f"{behind} | {sign_test_p(ahead, behind):.3f} |")
    return "\n".join(lines)


def plot_comparison(rows: list[dict[str, Any]], path: Path) -> Path:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    series = {"live (fresh runs on Ray)": "live", "simulator, stand-in runs": "simulated",
              "simulator, other runs of the family": "simulated_family"}
    x = np.arange(len(methods))
    fig, ax = plt.subplots(figsize=(7.5, 3.5))
    for i, (label, key) in enumerate(series.items()):
        ax.bar(x + (i - 1) * 0.27, [100 * np.mean([r[key] for r in rows if r["method"] == m]) for m in methods],
               0.27, label=label)
    ax.set_xticks(x, methods)
    ax.set_ylabel("success %")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def save_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    """Written whole or not at all: a stop mid-write leaves the rows saved before."""
    return write_text_atomic(path, json.dumps(rows, indent=1))


def load_rows(path: Path) -> list[dict[str, Any]]:
    """A live-compare rows file, checked to be a list of rows that name their stream and method."""
    try:
        rows = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"stream", "method"} <= r.keys()
                                             for r in rows):
        raise ConfigError(f"{path}: not a list of live-compare rows (objects with 'stream' and 'method')")
    return rows
