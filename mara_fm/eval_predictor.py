"""Predictor evaluation (docs/design.md §5.3): FM against WLS on every test task set.

Query protocol (`make_queries`, settings in `QueryConfig`). Thresholds and
budgets here do not come from the simulator's workload, so that this stage
can be evaluated on its own. Per test curve, with one seeded generator
walking the curves in id order:
- threshold ε = the family's reference curve at a uniformly drawn batch
  count t ∈ `eps_batches`; the reference curve is the per-batch median of
  the family's *train* curves' cumulative averages, or, for a family without
  train curves (the OOD sets), of the evaluated curves of that family;
- budget W uniform in `budget_batches` (clipped below the cap). W is drawn
  rather than set to the cap: with W = cap the remaining budget equals the
  horizon, every capped estimate reads "feasible" and budget-success accuracy
  measures nothing;
- ranks: `ranks` prefix lengths n_r = 4 + ⌊r·(end − 4)/ranks⌋, r = 0..ranks−1,
  end = min(first batch at or below ε, W), duplicates dropped; only queries
  whose current L(n) > ε are kept;
- each query asks for the remaining batches with horizon h/B = cap − n (the
  remaining generation cap, docs/design.md §5's default); truth r* = the true first
  crossing after n, capped at the horizon; "feasible" means r ≤ W − n.
FM's sampling settings were chosen on ID val when it was trained
(`train_predictor.tune_sampling`), never on a test or OOD set.

Calibration (`reliability`, `crps`): besides its point estimate (the median),
FM's M sampled crossings are scored as a forecast distribution, since the
simulator's teacher plans on one of their order statistics. WLS, a point
estimate, is scored as M identical samples so that the two compare.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mara_common.plotting import plt, save_figure
from mara_common.threads import torch_threads
from mara_common.tracking import mlflow_run
from mara_fm.bank import BankError, CurveSet, load_bank, select
from mara_fm.predictors import (
    WARMUP_POINTS,
    FMPredictor,
    HistoryBatch,
    HistoryPredictor,
    Predictor,
    RecallPredictor,
    WLSPredictor,
    first_crossing,
)
from mara_fm.predictors.recall import has_memory

EVAL_FILE = "predictor_eval.json"
LATENCY_BATCH = 256
SAMPLE_CHUNK = 1024  # queries per FM sampling call in `crossing_samples`
DEFAULT_SAMPLES = 8  # M for point predictors when no sampling predictor is evaluated
ENV_CALL_BATCH = 7  # prefix updates per simulator step at most (one per node)


@dataclass(frozen=True)
class QueryConfig:
    ranks: int = 8
    eps_batches: tuple[int, int] = (60, 280)
    budget_batches: tuple[int, int] = (40, 299)
    seed: int = 0


@dataclass(frozen=True)
class Queries:
    """Evaluation queries; `hist.future` holds the true curves."""

    hist: HistoryBatch
    eps: np.ndarray
    horizon: np.ndarray  # batches: cap − n
    budget: np.ndarray  # remaining budget W − n, batches
    truth: np.ndarray  # true remaining batches, capped at the horizon
    rank: np.ndarray
    curve: np.ndarray  # row in the CurveSet
    n_ranks: int

    def __len__(self) -> int:
        return len(self.eps)

    def subset(self, rows: np.ndarray) -> Queries:
        h = self.hist
        width = int(h.lengths[rows].max())
        hist = HistoryBatch(h.avg[rows, :width], h.lengths[rows], h.batch_size[rows], h.lr[rows],
                            h.future[rows], None if h.kind is None else h.kind[rows])
        return Queries(hist, self.eps[rows], self.horizon[rows], self.budget[rows],
                       self.truth[rows], self.rank[rows], self.curve[rows], self.n_ranks)


def reference_curves(curves: CurveSet, train: CurveSet | None) -> dict[str, np.ndarray]:
    """Per-family median cumulative-average curve: from train curves where the family has any."""
    ref = {}
    for fam in curves.family_names():
        pool = train.avg[train.families == fam] if train is not None else np.empty((0, curves.cap))
        if len(pool) == 0:
            pool = curves.avg[curves.families == fam]
        ref[fam] = np.median(pool, axis=0)
    return ref


def make_queries(curves: CurveSet, reference: dict[str, np.ndarray],
                 cfg: QueryConfig = QueryConfig()) -> Queries:
    """Queries on `curves` following the protocol in the module docstring."""
    rng = np.random.default_rng(cfg.seed)
    avg, cap = curves.avg, curves.cap
    rows, lengths, eps, budgets, ranks = [], [], [], [], []
    for i, fam in enumerate(curves.families):
        t = int(rng.integers(cfg.eps_batches[0], min(cfg.eps_batches[1], cap) + 1))
        w = int(rng.integers(cfg.budget_batches[0], min(cfg.budget_batches[1], cap - 1) + 1))
        e = float(reference[fam][t - 1])
        below = np.flatnonzero(avg[i] <= e)
        end = min(int(below[0]) + 1 if len(below) else cap, w)
        if end <= WARMUP_POINTS:
            continue
        ns = WARMUP_POINTS + np.arange(cfg.ranks) * (end - WARMUP_POINTS) // cfg.ranks
        ns, first = np.unique(ns, return_index=True)
        keep = avg[i, ns - 1] > e
        for n, r in zip(ns[keep], first[keep], strict=True):
            rows.append(i)
            lengths.append(n)
            eps.append(e)
            budgets.append(w - n)
            ranks.append(r)
    if not rows:
        raise ValueError("no evaluation queries: every curve reaches its threshold during warm-up")
    rows_a, n_a = np.asarray(rows), np.asarray(lengths, dtype=np.int64)
    hist = dataclasses.replace(HistoryBatch.from_curves(avg[rows_a], n_a, curves.batch_size[rows_a],
                                                        curves.lr[rows_a]), kind=curves.families[rows_a])
    eps_a = np.asarray(eps)
    horizon = (cap - n_a).astype(np.float64)
    truth = first_crossing(avg[rows_a], n_a, eps_a, horizon)
    return Queries(hist, eps_a, horizon, np.asarray(budgets, np.float64), truth,
                   np.asarray(ranks), rows_a, cfg.ranks)


def score(pred: np.ndarray, q: Queries) -> dict:
    """Capped MAE, budget-success accuracy and MAE per query rank."""
    err = np.abs(np.minimum(pred, q.horizon) - q.truth)
    by_rank = [float(err[q.rank == r].mean()) if np.any(q.rank == r) else None
               for r in range(q.n_ranks)]
    return {
        "n_queries": len(q),
        "capped_mae": float(err.mean()),
        "budget_accuracy": float(np.mean((pred <= q.budget) == (q.truth <= q.budget))),
        "mae_by_rank": by_rank,
    }


def crossing_samples(pred: Predictor, q: Queries, samples: int,
                     point: np.ndarray | None = None) -> np.ndarray:
    """(Q, M) each query's sampled remaining batches, ascending, in [0, horizon].

    A predictor with `sorted_crossings` (FM, history) gives its M sampled crossings (a
    path that never crosses sits at the horizon), computed `SAMPLE_CHUNK`
    queries at a time; every query is past warm-up and above ε, so the
    `remaining_batches` rules change nothing but the clip applied here. Any
    other predictor is a point estimate: `point` (or its `remaining_batches`)
    repeated `samples` times.
    """
    if hasattr(pred, "sorted_crossings"):
        parts = []
        for start in range(0, len(q), SAMPLE_CHUNK):
            sub = q.subset(np.arange(start, min(start + SAMPLE_CHUNK, len(q))))
            parts.append(pred.sorted_crossings(sub.hist, sub.eps, sub.horizon))
        out = np.concatenate(parts)
    else:
        if point is None:
            point = pred.remaining_batches(q.hist, q.eps, q.horizon)
        out = np.repeat(np.asarray(point, np.float64)[:, None], samples, axis=1)
    return np.clip(out, 0.0, q.horizon[:, None])


def reliability(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(M,) for k = 1..M the share of queries whose truth lies below the k-th smallest sample.

    For a calibrated sampler (truth and samples exchangeable) the share is
    k/(M+1). Truth and samples must share one cap (the horizon): a path that
    never crosses and a truth that never crosses both read h, which says only
    that both lie at or beyond h, not which is smaller.

    Ties, the capped ones above all, are broken at random and the expectation
    is taken: with a samples strictly below the truth and t equal to it, the
    truth's rank among the samples is uniform on a..a+t, so query i counts
    clip((k − a)/(t + 1), 0, 1) at k. A single tie (t = 1) is the half weight;
    with t tied samples the weights are 1/(t+1), …, t/(t+1), which keeps a
    calibrated sampler at k/(M+1) exactly even when many of its paths and the
    truth are capped (a flat half per tie does not: it reads 1/2 for every
    capped order statistic). Capped-truth queries are kept, not excluded:
    dropping them would select on the outcome (a calibrated sampler would look
    too slow on what remains), and they are the infeasible tasks a planner
    must recognise.
    """
    samples = np.asarray(samples, np.float64)
    truth = np.asarray(truth, np.float64)[:, None]
    below = (samples < truth).sum(axis=1, keepdims=True)
    tied = (samples == truth).sum(axis=1, keepdims=True)
    k = np.arange(1, samples.shape[1] + 1)[None, :]
    return np.clip((k - below) / (tied + 1), 0.0, 1.0).mean(axis=0)


def calibration_max_dev(shares: np.ndarray) -> float:
    """Largest |observed − k/(M+1)| over k = 1..M."""
    shares = np.asarray(shares, np.float64)
    nominal = np.arange(1, len(shares) + 1) / (len(shares) + 1)
    return float(np.abs(shares - nominal).max())


def crps(samples: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(Q,) the sample CRPS mean_i |x_i − y| − (1/(2M²)) Σ_ij |x_i − x_j| of each query.

    Σ_ij |x_i − x_j| = 2 Σ_i (2i − M − 1)·x_(i) over the ascending x_(i), so
    this is O(M) per query. M identical samples give |x − y|. With samples and
    truth capped at the horizon it is the CRPS of the censored demand, still a
    proper score, in batches like the capped MAE.
    """
    x = np.sort(np.asarray(samples, np.float64), axis=1)
    m = x.shape[1]
    spread = x @ (2 * np.arange(1, m + 1) - m - 1) / m**2  # (1/(2M²)) Σ_ij |x_i − x_j|
    return np.abs(x - np.asarray(truth, np.float64)[:, None]).mean(axis=1) - spread


def calibration(samples: np.ndarray, q: Queries) -> dict:
    """Reliability curve, its largest deviation and the mean CRPS of sampled crossings."""
    shares = reliability(samples, q.truth)
    return {"reliability": [float(v) for v in shares], "calibration_max_dev": calibration_max_dev(shares),
            "crps": float(crps(samples, q.truth).mean())}


def call_ms(pred: Predictor, q: Queries, batch: int, repeats: int = 30) -> float:
    """Median wall time (ms) of one `remaining_batches` call on `batch` prefixes."""
    sub = q.subset(np.arange(batch) % len(q))
    times = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        pred.remaining_batches(sub.hist, sub.eps, sub.horizon)
        times.append(time.perf_counter() - start)
    return float(np.median(times[3:]) * 1e3)


def bank_query_sets(frame, cfg: QueryConfig) -> dict[str, tuple[CurveSet, Queries]]:
    """Queries on the `test` split of every task set the bank holds."""
    sets = {}
    for task_set in sorted(frame.loc[frame["split"] == "test", "task_set"].unique()):
        curves = select(frame, task_set, "test")
        try:
            train = select(frame, task_set, "train")
        except BankError:
            train = None
        try:
            sets[task_set] = (curves, make_queries(curves, reference_curves(curves, train), cfg))
        except ValueError as exc:
            raise ValueError(f"task set {task_set!r}: {exc}") from exc
    return sets


def evaluate(predictors: dict[str, Predictor], query_sets: dict[str, tuple[CurveSet, Queries]],
             timing: bool = True) -> list[dict]:
    """One record per (predictor, task set); FM records carry the change vs WLS.

    Calibration uses M = the sample count of the first sampling predictor
    (FM), `DEFAULT_SAMPLES` without one; point predictors repeat their estimate M times.
    """
    m = next((p.samples for p in predictors.values() if hasattr(p, "sorted_crossings")), DEFAULT_SAMPLES)
    records = []
    for task_set, (_, q) in query_sets.items():
        by_name = {}
        for name, pred in predictors.items():
            point = pred.remaining_batches(q.hist, q.eps, q.horizon)
            rec = {"task_set": task_set, "predictor": name, **score(point, q),
                   **calibration(crossing_samples(pred, q, m, point), q)}
            if timing:
                rec["ms_per_prefix"] = call_ms(pred, q, LATENCY_BATCH) / LATENCY_BATCH
                rec["ms_per_call_7"] = call_ms(pred, q, ENV_CALL_BATCH)
            by_name[name] = rec
            records.append(rec)
        if "wls" in by_name:
            base = by_name["wls"]
            for name, rec in by_name.items():
                if name != "wls":
                    rec["mae_reduction_vs_wls"] = 1 - rec["capped_mae"] / base["capped_mae"]
                    rec["accuracy_gain_vs_wls"] = rec["budget_accuracy"] - base["budget_accuracy"]
    return records


def evaluated_predictors(path: Path) -> set[str]:
    """The predictors an evaluation file (`EVAL_FILE`) scored."""
    return {r["predictor"] for r in json.loads(Path(path).read_text())}


def markdown_table(records: list[dict]) -> str:
    """The predictor table; records written before calibration was scored show "—" there."""
    lines = ["| task set | predictor | queries | capped MAE | vs WLS | budget acc. | ms/prefix (256) "
             "| ms/call (7) | CRPS | max calib. dev. |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        change = f"{-100 * r['mae_reduction_vs_wls']:+.1f}%" if "mae_reduction_vs_wls" in r else "—"
        crps_cell = f"{r['crps']:.2f}" if "crps" in r else "—"
        dev_cell = f"{r['calibration_max_dev']:.3f}" if "calibration_max_dev" in r else "—"
        lines.append(
            f"| {r['task_set']} | {r['predictor']} | {r['n_queries']} | {r['capped_mae']:.2f} | {change} "
            f"| {100 * r['budget_accuracy']:.1f}% | {r.get('ms_per_prefix', float('nan')):.4f} "
            f"| {r.get('ms_per_call_7', float('nan')):.3f} | {crps_cell} | {dev_cell} |"
        )
    return "\n".join(lines) + "\n"


def plot_mae_by_rank(records: list[dict], path: Path) -> Path:
    sets = sorted({r["task_set"] for r in records})
    fig, axes = plt.subplots(1, len(sets), figsize=(4.2 * len(sets), 3.4), squeeze=False)
    for ax, task_set in zip(axes[0], sets, strict=True):
        for r in (r for r in records if r["task_set"] == task_set):
            vals = [np.nan if v is None else v for v in r["mae_by_rank"]]
            ax.plot(range(1, len(vals) + 1), vals, marker="o", label=r["predictor"])
        ax.set(title=task_set, xlabel="query rank (prefix position in budget)", ylabel="capped MAE (batches)")
        ax.legend()
    return save_figure(fig, path)


def plot_reliability(records: list[dict], path: Path) -> Path:
    """Observed share below the k-th smallest sample against nominal k/(M+1), one panel per task set."""
    sets = sorted({r["task_set"] for r in records})
    fig, axes = plt.subplots(1, len(sets), figsize=(3.8 * len(sets), 3.6), squeeze=False)
    for ax, task_set in zip(axes[0], sets, strict=True):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="calibrated")
        for r in (r for r in records if r["task_set"] == task_set and "reliability" in r):
            m = len(r["reliability"])
            nominal = np.arange(1, m + 1) / (m + 1)
            ax.plot(nominal, r["reliability"], marker="o", ms=3,
                    label=f"{r['predictor']} (CRPS {r['crps']:.1f}, max dev {r['calibration_max_dev']:.2f})")
        ax.set(title=task_set, xlabel="nominal k/(M+1)", ylabel="observed P(r* < k-th sample)",
               xlim=(0, 1), ylim=(0, 1), aspect="equal")
        ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def plot_forecast(fm: Predictor, wls: Predictor, curves: CurveSet, q: Queries, path: Path) -> Path:
    """One query: observed prefix, true future, FM's sampled paths, both crossing estimates."""
    # Shown: the rank-2 query whose true crossing sits closest to 40% of its horizon.
    gap = np.where(q.rank == 2, np.abs(q.truth / q.horizon - 0.4), np.inf)
    i = int(np.argmin(gap))
    one = q.subset(np.array([i]))
    n, b, eps = int(one.hist.lengths[0]), float(one.hist.batch_size[0]), float(one.eps[0])
    curve = curves.avg[q.curve[i]]
    s, paths = fm.forecast(one.hist, one.horizon)
    est = {name: float(p.remaining_batches(one.hist, one.eps, one.horizon)[0])
           for name, p in (("FM", fm), ("WLS", wls))}
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.arange(1, len(curve) + 1)
    ax.plot(x[:n], curve[:n], "k-", lw=2, label="observed prefix")
    ax.plot(x[n - 1:], curve[n - 1:], "k--", lw=1, label="true future")
    for m, path_m in enumerate(paths[0]):
        ax.plot(s[0] / b, path_m, color="tab:blue", alpha=0.35, lw=1, label="FM samples" if m == 0 else None)
    ax.axhline(eps, color="grey", lw=0.8, label="threshold ε")
    ax.axvline(n + one.truth[0], color="k", ls=":", label=f"true crossing (+{one.truth[0]:.0f})")
    for (name, r), colour, style in zip(est.items(), ("tab:blue", "tab:red"), ("--", "-."), strict=True):
        ax.axvline(n + r, color=colour, ls=style, lw=1.5, label=f"{name} estimate (+{r:.0f})")
    ax.set(xlabel="batches", ylabel="cumulative-average loss",
           title=f"{curves.ids[q.curve[i]]}, prefix {n}")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def run_eval(predictor_path: str | Path, bank_path: str | Path, out_dir: str | Path,
             query_cfg: QueryConfig = QueryConfig(), tracking: bool = True,
             threads: int = 1, history_bank: str | Path | None = None) -> list[dict]:
    """Evaluate FM, recall (FM with its training runs as a memory, docs/design.md §5.6, where
    the export has one) and WLS on every test task set of a bank; write JSON, Markdown, PNGs.
    With `history_bank`, the history predictor too (docs/design.md §5.5): told each task's
    kind and reading that bank's runs, a predictor of a setting beyond the paper's.

    Runs (and times) with `threads` torch threads: the simulator calls the
    predictor on a handful of prefixes, where one thread is the fast setting.
    """
    with torch_threads(threads):
        return _run_eval(predictor_path, bank_path, out_dir, query_cfg, tracking, threads, history_bank)


def _run_eval(predictor_path: str | Path, bank_path: str | Path, out_dir: Path | str,
              query_cfg: QueryConfig, tracking: bool, threads: int,
              history_bank: str | Path | None) -> list[dict]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fm, wls = FMPredictor.load(predictor_path), WLSPredictor()
    predictors: dict[str, Predictor] = {"fm": fm, "wls": wls}
    if has_memory(predictor_path):
        predictors["recall"] = RecallPredictor.load(predictor_path)
    if history_bank is not None:
        predictors["history"] = HistoryPredictor.load(history_bank)
    query_sets = bank_query_sets(load_bank(bank_path), query_cfg)
    records = evaluate(predictors, query_sets)
    settings = {"bank": str(bank_path), "predictor_path": str(predictor_path),
                "query_protocol": asdict(query_cfg), "torch_threads": threads}
    if history_bank is not None:
        settings["history_bank"] = str(history_bank)
    for r in records:
        if r["predictor"] == "fm":
            r.update(samples=fm.cfg.samples, euler_steps=fm.cfg.euler_steps)
        r.update(settings)
    (out_dir / EVAL_FILE).write_text(json.dumps(records, indent=1))
    (out_dir / "predictor_eval.md").write_text(markdown_table(records))
    plot_mae_by_rank(records, out_dir / "mae_by_rank.png")
    plot_reliability(records, out_dir / "reliability.png")
    first = "id" if "id" in query_sets else next(iter(query_sets))
    plot_forecast(fm, wls, *query_sets[first], out_dir / "forecast_example.png")
    if tracking:
        _log_eval(records, out_dir, settings)
    return records


def _log_eval(records: list[dict], out_dir: Path, settings: dict) -> None:
    import mlflow

    with mlflow_run("mara-predictor", run_name="eval", tags={"stage": "eval", **settings}):
        for r in records:
            prefix = f"{r['task_set']}.{r['predictor']}"
            for key in ("capped_mae", "budget_accuracy", "ms_per_prefix", "ms_per_call_7",
                        "mae_reduction_vs_wls", "accuracy_gain_vs_wls", "crps", "calibration_max_dev"):
                if key in r:
                    mlflow.log_metric(f"{prefix}.{key}", r[key])
        mlflow.log_artifacts(str(out_dir), "predictor_eval")
