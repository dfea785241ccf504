"""What an evaluation keeps: one `Record` per method × task set × load (and seed), the
results folder's files, the journal of cells finished so far, and the MLflow runs
(docs/design.md §8)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from mara_common.config import ConfigError
from mara_common.tracking import mlflow_run
from mara_rl.provenance import INPUTS_JSON

EVAL_EXPERIMENT = "mara-evaluation"
CELL_JOURNAL = "cells.jsonl"  # in the results folder while an evaluation runs: its finished cells


@dataclass
class Record:
    """One cell's outcome: a method (one training seed) on one task set, load and scenario,
    with its per-episode success rates, so that methods can be paired episode by episode."""

    method: str
    task_set: str
    load: float
    scenario: str
    success_rate_mean: float
    success_rate_std: float  # sample std over evaluation roots
    per_root: list[float]
    per_episode: list[float]
    tasks_per_episode: float
    diagnostics: dict[str, float] = field(default_factory=dict)
    seed: int | None = None  # the method's training seed; per_episode is in the same order for all
    split: str = "test"  # which curves the episodes came from ("val" for choices made on results)


def load_records(paths: Sequence[str | Path]) -> list[Record]:
    """Every record of the `results.json` files, naming a file that is not one."""
    records = []
    for path in paths:
        try:
            records += [Record(**r) for r in json.loads(Path(path).read_text())]
        except (json.JSONDecodeError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{path}: not a results file of `mara evaluate` ({exc}); "
                              "evaluate again to rewrite it") from None
    return records


def stored_records(out_dir: Path) -> dict[str, Record]:
    """cell key → record of the evaluation `out_dir` holds (none if it holds none, or one
    written before cells had keys)."""
    results, inputs = out_dir / "results.json", out_dir / INPUTS_JSON
    if not (results.exists() and inputs.exists()):
        return {}
    try:
        keys = json.loads(inputs.read_text()).get("cells", [])
        records = [Record(**r) for r in json.loads(results.read_text())]
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{out_dir}: results.json or {INPUTS_JSON} is not what `mara evaluate` writes ({exc}); "
                          "delete them, or evaluate with --fresh") from None
    return dict(zip(keys, records, strict=True)) if len(keys) == len(records) else {}


def journal_records(out_dir: Path) -> dict[str, Record]:
    """cell key → record of the cells that an evaluation into `out_dir` finished before it was
    stopped. Only the last line may be cut short (a process killed while writing it)."""
    path = out_dir / CELL_JOURNAL
    lines = path.read_text().splitlines() if path.exists() else []
    found: dict[str, Record] = {}
    for n, line in enumerate(lines, start=1):
        try:
            entry = json.loads(line)
            found[entry["key"]] = Record(**entry["record"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            if n < len(lines):
                raise ConfigError(f"{path}, line {n}: not a cell that `mara evaluate` journals ({exc}); "
                                  "delete the file to evaluate those cells again") from None
    return found


def open_journal(out_dir: Path) -> TextIO:
    """The journal of `out_dir`, to append finished cells to (a cut-short last line dropped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / CELL_JOURNAL
    if path.exists():
        text = path.read_text()
        path.write_text(text[:text.rfind("\n") + 1])
    return path.open("a")


def markdown_table(records: list[Record]) -> str:
    lines = ["| method | task set | load | scenario | success % (mean ± std) | tasks/ep | "
             "utilisation | full queue | waiting | readiness |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    def fmt(d: dict[str, float], key: str, scale: float = 1.0, digits: int = 2) -> str:
        v = d.get(key, math.nan)
        return "–" if math.isnan(v) else f"{v * scale:.{digits}f}"

    for r in records:
        d = r.diagnostics
        method = r.method if r.seed is None else f"{r.method} (seed {r.seed})"
        task_set = r.task_set if r.split == "test" else f"{r.task_set} ({r.split})"
        lines.append(
            f"| {method} | {task_set} | {r.load:.2f} | {r.scenario} | "
            f"{100 * r.success_rate_mean:.2f} ± {100 * r.success_rate_std:.2f} | "
            f"{r.tasks_per_episode:.2f} | {fmt(d, 'utilisation', 100, 1)} | "
            f"{fmt(d, 'full_queue_fraction', 100, 1)} | {fmt(d, 'waiting_population')} | "
            f"{fmt(d, 'readiness_steps', 1, 1)} |"
        )
    return "\n".join(lines) + "\n"


def write_results(records: list[Record], out_dir: Path, inputs: dict[str, Any] | None = None) -> None:
    """results.json and results.md, and `inputs` (`evaluation_inputs`) as inputs.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps([asdict(r) for r in records], indent=1))
    (out_dir / "results.md").write_text(markdown_table(records))
    if inputs is not None:
        (out_dir / INPUTS_JSON).write_text(json.dumps(inputs, indent=1))


def record_name(r: Record) -> str:
    """A run name that says what the record is: method (seed), task set (split), load, and
    the stress scenario where it is one."""
    seed = "" if r.seed is None else f" seed {r.seed}"
    split = "" if r.split == "test" else f" ({r.split})"
    scenario = "" if r.scenario == "default" else f" · {r.scenario}"
    return f"{r.method}{seed} · {r.task_set}{split} · p={r.load:g}{scenario}"


def log_records(records: list[Record], out_dir: Path | None, tags: dict[str, Any] | None = None) -> None:
    """One MLflow run for the evaluation (holding its results files once), with one nested
    run per record: the same metric names everywhere, for the compare view."""
    import mlflow

    tags = {k: str(v) for k, v in (tags or {}).items()}
    title = " · ".join(["evaluation", *(tags[k] for k in ("evaluation", "profile") if k in tags)])
    with mlflow_run(EVAL_EXPERIMENT, title, {**tags, "kind": "evaluation"}):
        if out_dir is not None:
            mlflow.log_artifacts(str(out_dir))
        for r in records:
            params = {"method": r.method, "task_set": r.task_set, "load": r.load, "scenario": r.scenario,
                      "split": r.split, **({} if r.seed is None else {"seed": r.seed})}
            with mlflow_run(EVAL_EXPERIMENT, record_name(r), {**tags, **params, "kind": "record"}, nested=True):
                mlflow.log_params(params)
                metrics = {"success_rate_mean": r.success_rate_mean,
                           "success_rate_std": r.success_rate_std,
                           "tasks_per_episode": r.tasks_per_episode}
                metrics.update({k: v for k, v in r.diagnostics.items() if not math.isnan(v)})
                mlflow.log_metrics(metrics)
