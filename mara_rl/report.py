"""The evaluation report: Tables 2–4, the load sweep (Figure 4), paired CIs.

Input is the flat list of `Record`s that `evaluate` wrote (any number of
`results.json` files). Every number is computed once into `report.json`; the
Markdown is formatted from those same values, so the two cannot disagree.

Pairing. Within a scope (scenario, load, task sets) every method ran on the
same frozen episodes, so a comparison reference − other is, per task set, a
matrix of paired differences over scheduler training seeds × episodes; a
method without a seed (FIFO, EDF, LARA, Oracle, ...) has the same value for
every seed. The interval is the hierarchical bootstrap of `mara_rl.stats`
(docs/design.md §9.1): seeds and episodes are resampled separately, episodes
inside their own task set, and the "mean" column averages the task sets with
equal weight in every resample.

The first comparison is the learned policy's own contribution: the reference
against the best hand-written rule (the registry's `rule` methods; for a variant
told job kinds, its `history` methods too), the best being chosen in each scope
as the rule with the highest mean success there.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mara_common.paths import README
from mara_common.plotting import plt, save_figure
from mara_common.tracking import mlflow_run
from mara_fm.eval_predictor import markdown_table as predictor_table
from mara_rl.evaluate import COMPLETION, DIAGNOSTICS, slack_bands
from mara_rl.methods import BUILTIN, SPECS, VARIANTS, rule_names
from mara_rl.records import EVAL_EXPERIMENT, Record
from mara_rl.stats import BootstrapConfig, difference_matrix, hierarchical_bootstrap, mean_std
from mara_rl.timeline import TIMELINE_PNG

REPORT_JSON, REPORT_MD = "report.json", "report.md"
SWEEP_PNG, COMPARISON_PNG = "load_sweep.png", "comparisons.png"
MEAN = "mean"  # the column of Table 2 that averages the task sets
RESULTS_BEGIN, RESULTS_END = "<!-- results:begin -->", "<!-- results:end -->"  # the README's block


@dataclass(frozen=True)
class ReportConfig:
    """What the report compares and the targets it checks (a profile's [report] section)."""

    main_load: float = 0.04
    task_sets: tuple[str, ...] = ("id", "rl_ood", "vit_ood")
    reference: str = "mara"
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig)
    target_margin: float = 0.085  # MARA − LARA on the mean, the paper's figure rounded down
    target_margin_id: float = 0.08  # MARA − LARA on ID (stage two's own target)
    target_margin_rule: float = 0.015  # MARA − the best hand-written rule on the mean
    target_oracle_gap: float = 0.04  # Oracle bound − MARA on the mean, at most


@dataclass
class Scores:
    """One method in one scope: its episodes per task set; its roots averaged over the task sets."""

    episodes: dict[str, dict[int | None, np.ndarray]]  # task set → seed → per-episode success rates
    roots: dict[int | None, np.ndarray]  # seed → per-root success rates, equal weight per task set
    tasks_per_episode: float
    diagnostics: dict[str, float | None]  # None where never measured (the Oracle is not simulated)

    def summary(self) -> dict[str, float]:
        """Mean ± sample std over seed × root combinations."""
        mean, std = mean_std(np.concatenate(list(self.roots.values())))
        return {"mean": mean, "std": std, "n": sum(len(v) for v in self.roots.values()),
                "tasks_per_episode": self.tasks_per_episode}


def method_names(records: list[Record]) -> list[str]:
    """The methods of `records` in the registry's order (learned variants, then the built-in
    methods), whatever order the evaluations came in; others after them, as they come."""
    seen = list(dict.fromkeys(r.method for r in records))
    order = [v.name for v in VARIANTS] + [s.name for s in BUILTIN]
    return sorted(seen, key=lambda m: order.index(m) if m in order else len(order) + seen.index(m))


def scores(records: list[Record], method: str, scenario: str, load: float,
           task_sets: Sequence[str]) -> Scores | None:
    """The method's scores in a scope, or None where any task set of it was not evaluated."""
    chosen = [r for r in records if r.method == method and r.scenario == scenario
              and math.isclose(r.load, load) and r.task_set in task_sets]
    by_seed: dict[int | None, dict[str, Record]] = {}
    for r in chosen:
        by_seed.setdefault(r.seed, {})[r.task_set] = r
    if not by_seed or any(set(sets) != set(task_sets) for sets in by_seed.values()):
        return None
    diag = {k: np.array([r.diagnostics.get(k, math.nan) for r in chosen], float)
            for k in (*DIAGNOSTICS, *COMPLETION)}
    return Scores(
        episodes={t: {s: np.asarray(sets[t].per_episode, float) for s, sets in by_seed.items()}
                  for t in task_sets},
        roots={s: np.mean([sets[t].per_root for t in task_sets], axis=0) for s, sets in by_seed.items()},
        tasks_per_episode=float(np.mean([r.tasks_per_episode for r in chosen])),
        diagnostics={k: None if np.isnan(v).all() else float(np.nanmean(v)) for k, v in diag.items()},
    )


def choose_reference(methods: list[str], preferred: str) -> tuple[str | None, str]:
    """The method every other is compared against, and a note when it is not `preferred`."""
    if preferred in methods:
        return preferred, ""
    trained = [m for m in methods if m not in SPECS]
    if trained:
        return trained[0], f"`{preferred}` was not evaluated: comparisons use `{trained[0]}` instead."
    return None, f"`{preferred}` and every learned method are absent: MARA comparisons are skipped."


def compare(ref: Scores, other: Scores, cfg: BootstrapConfig) -> dict[str, Any]:
    """ref − other in one scope: one seeds × episodes matrix per task set, hierarchical bootstrap."""
    if set(ref.episodes) != set(other.episodes):
        raise ValueError(f"different task sets: {sorted(ref.episodes)} vs {sorted(other.episodes)}")
    diff = hierarchical_bootstrap([difference_matrix(ref.episodes[t], other.episodes[t])
                                   for t in ref.episodes], cfg)
    return {**asdict(diff), "excludes_zero": diff.excludes_zero}


def best_rule(rows: dict[str, Scores], method: str | None, cfg: BootstrapConfig,
              known: dict[str, dict] | None = None) -> dict[str, Any] | None:
    """`method` − the hand-written rule it is measured against (`rule_names`) with the highest
    mean success in this scope; None where the method or every such rule is absent. `known`:
    the scope's comparisons of `method` already made, reused rather than bootstrapped again."""
    rules = [m for m in rule_names(method) if m in rows and m != method]
    if method not in rows or not rules:
        return None
    best = max(rules, key=lambda m: rows[m].summary()["mean"])  # ties: the registry's order
    diff = (known or {}).get(best) or compare(rows[method], rows[best], cfg)
    return {"rule": best, "rule_mean": rows[best].summary()["mean"],
            "reference_mean": rows[method].summary()["mean"], **diff}


def build(records: list[Record], cfg: ReportConfig = ReportConfig(),
          predictor_eval: list[dict] | None = None) -> dict[str, Any]:
    """Every number of the report, as plain JSON-ready values."""
    splits = sorted({r.split for r in records})
    if len(splits) > 1:
        raise ValueError(f"results mix episodes of the splits {splits}: a report compares methods on "
                         "one set of frozen episodes (keep validation results in another folder)")
    methods = method_names(records)
    reference, note = choose_reference(methods, cfg.reference)
    default = [r for r in records if r.scenario == "default"]
    task_sets = [t for t in cfg.task_sets if any(r.task_set == t for r in default)]
    main_scopes = {t: [t] for t in task_sets} | ({MEAN: task_sets} if len(task_sets) > 1 else {})

    def scope_rows(scenario: str, load: float, sets: Sequence[str]) -> dict[str, Scores]:
        found = {m: scores(records, m, scenario, load, sets) for m in methods}
        return {m: s for m, s in found.items() if s is not None}

    def comparisons(rows: dict[str, Scores]) -> dict[str, dict]:
        if reference not in rows:
            return {}
        return {m: compare(rows[reference], s, cfg.bootstrap) for m, s in rows.items() if m != reference}

    main = {col: scope_rows("default", cfg.main_load, sets) for col, sets in main_scopes.items()}
    table2 = {m: {col: main[col][m].summary() for col in main if m in main[col]} for m in methods}
    # Methods trained with several seeds, seed by seed: is a difference larger than the seed spread?
    seeds = {m: sorted({s for rows in main.values() if m in rows for s in rows[m].roots}, key=lambda s: -1 if s is None else s) for m in methods}
    table2_seeds = {m: {str(s): {col: float(np.mean(rows[m].roots[s])) for col, rows in main.items()
                                 if m in rows and s in rows[m].roots} for s in seeds[m]}
                    for m in methods if len(seeds[m]) > 1}
    widest = MEAN if MEAN in main else next(iter(main), None)  # Table 4's scope, and the variants'
    widest_rows = main[widest] if widest else {}

    stress_sets = sorted({r.task_set for r in records if r.scenario == "stress"})
    stress_load = next((r.load for r in records if r.scenario == "stress"), cfg.main_load)
    stress = scope_rows("stress", stress_load, stress_sets) if stress_sets else {}

    # The sweep runs on the task sets evaluated at every load (typically ID alone).
    loads = sorted({r.load for r in default})
    sweep_sets = sorted(set.intersection(*({r.task_set for r in default if r.load == p} for p in loads))) \
        if loads else []
    sweep = {p: scope_rows("default", p, sweep_sets) for p in loads}  # one load: a one-point sweep

    main_comps = {col: comparisons(rows) for col, rows in main.items()}
    stress_comps = comparisons(stress)
    sweep_comps = {f"{p:g}": comparisons(rows) for p, rows in sweep.items()}
    by_col = {col: best_rule(main[col], reference, cfg.bootstrap, main_comps[col]) for col in main}
    by_load = {f"{p:g}": best_rule(sweep[p], reference, cfg.bootstrap, sweep_comps[f"{p:g}"]) for p in loads}
    vs_best_rule = {"rules": [m for m in rule_names(reference) if m in methods and m != reference],
                    "table2": {col: c for col, c in by_col.items() if c},
                    "load_sweep": {p: c for p, c in by_load.items() if c},
                    "stress": best_rule(stress, reference, cfg.bootstrap, stress_comps)}  # None where not evaluated
    # Every learned variant against the rules it is measured against, on Table 2's widest scope.
    variants = {m: by_col.get(widest) if m == reference else best_rule(widest_rows, m, cfg.bootstrap)
                for m in methods if m not in SPECS}

    report = {
        "reference": reference,
        "reference_note": note,
        "main_load": cfg.main_load,
        "bootstrap": asdict(cfg.bootstrap),
        "table2": {"columns": list(main), "rows": {m: c for m, c in table2.items() if c}},
        "table2_seeds": table2_seeds,
        "vs_best_rule": vs_best_rule,
        "variants_vs_best_rule": {"scope": widest, "rows": {m: c for m, c in variants.items() if c}},
        "table2_comparisons": main_comps,
        "table3": {"task_sets": stress_sets, "rows": {m: s.summary() for m, s in stress.items()}},
        "table3_comparisons": stress_comps,
        "load_sweep": {"task_sets": sweep_sets, "loads": loads,
                       "rows": {m: {f"{p:g}": sweep[p][m].summary() for p in loads if m in sweep[p]}
                                for m in methods if any(m in sweep[p] for p in loads)}},
        "load_sweep_comparisons": sweep_comps,
        "table4": {m: s.diagnostics for m, s in widest_rows.items()},
        "predictor": predictor_eval,
    }
    report["targets"] = target_checks(report, cfg) if reference else []
    return report


def target_checks(report: dict[str, Any], cfg: ReportConfig) -> list[dict[str, Any]]:
    """The paper's relative results, and the learned policy's own, as pass/fail lines on this
    report's numbers."""
    margin, margin_id, ref = cfg.target_margin, cfg.target_margin_id, report["reference"]
    mean = report["table2_comparisons"].get(MEAN, {})
    on_id = report["table2_comparisons"].get("id", {})
    sweep = report["load_sweep_comparisons"]
    stress = report["table3"]["rows"]
    checks = []

    def add(name: str, met: bool, evidence: str) -> None:
        checks.append({"target": name, "met": bool(met), "evidence": evidence})

    rule = report["vs_best_rule"]
    if MEAN in rule["table2"]:
        c = rule["table2"][MEAN]
        add(f"{ref} − best rule ≥ {100 * cfg.target_margin_rule:+.1f} points on the mean, CI excluding 0",
            c["mean"] >= cfg.target_margin_rule and c["low"] > 0, f"{interval(c)} vs {c['rule']}")
    if sweep and set(rule["load_sweep"]) == set(sweep):
        add(f"{ref} − best rule ≥ 0 at every load of the sweep",
            all(c["mean"] >= 0 for c in rule["load_sweep"].values()),
            ", ".join(f"p = {p}: {points(c['mean'])} vs {c['rule']}" for p, c in rule["load_sweep"].items()))
    if "oracle" in mean:
        c = mean["oracle"]  # reference − Oracle: the gap is its negative
        add(f"gap to the Oracle bound on the mean ≤ {100 * cfg.target_oracle_gap:.1f} points",
            -c["mean"] <= cfg.target_oracle_gap,
            f"{100 * -c['mean']:.2f} [{100 * -c['high']:.2f}, {100 * -c['low']:.2f}]")

    if "lara" in mean:
        c = mean["lara"]
        evidence = interval(c)
        rows = report["table2"]["rows"]
        references = {"lara_oracle": "LARA told the true demand",
                      "llf_oracle": "least-laxity planner told the true demand"}
        lara = rows.get("lara", {}).get(MEAN)
        rooms = [f"{name}, {what}: {points(rows[name][MEAN]['mean'] - lara['mean'])}"
                 for name, what in references.items() if lara and MEAN in rows.get(name, {})]
        if rooms:
            evidence += f" ({'; '.join(rooms)})"
        add(f"{ref} − lara on the mean ≥ {100 * margin:.1f} points, CI excluding 0",
            c["mean"] >= margin and c["low"] > 0, evidence)
    if "lara" in on_id:
        add(f"{ref} − lara on id ≥ {100 * margin_id:.1f} points",
            on_id["lara"]["mean"] >= margin_id, interval(on_id["lara"]))
    for other in ("edf", "fifo"):
        if other in on_id:
            add(f"{ref} above {other} on id", on_id[other]["mean"] > 0, interval(on_id[other]))
    if sweep and all("lara" in comps for comps in sweep.values()):
        add(f"{ref} − lara > 0 at every load of the sweep",
            all(comps["lara"]["mean"] > 0 for comps in sweep.values()),
            ", ".join(f"p = {p}: {points(comps['lara']['mean'])}" for p, comps in sweep.items()))
    for other in ("lara_fm", "mara_wls"):
        if other in mean:
            add(f"{ref} above {other} on the mean", mean[other]["mean"] > 0, interval(mean[other]))
    if ref in stress and "oracle" in stress:
        got, bound = stress[ref]["mean"], stress["oracle"]["mean"]
        add(f"stress: {ref} at the Oracle bound", got >= bound, f"{pct(got)} vs {pct(bound)}")
    return checks


# ---------------------------------------------------------------- formatting
def pct(x: float) -> str:
    return f"{100 * x:.2f}"


def points(x: float) -> str:
    return f"{100 * x:+.2f}"


def mean_pm_std(cell: dict[str, float]) -> str:
    return f"{pct(cell['mean'])} ± {pct(cell['std'])}"


def sample_size(c: dict) -> str:
    """Training seeds × frozen episodes (summed over task sets) a comparison pairs."""
    return f"{c['seeds']} × {c['episodes']}"


def interval(c: dict) -> str:
    text = f"{points(c['mean'])} [{points(c['low'])}, {points(c['high'])}]"
    return text if c["excludes_zero"] else text + " (includes 0)"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def comparison_section(by_column: dict[str, dict[str, dict]], reference: str) -> str:
    """A CI table (rows: other method, columns: scope) and a plain list of non-significant ones."""
    columns = [c for c, comps in by_column.items() if comps]
    if not columns:
        return ""
    others = list(dict.fromkeys(m for c in columns for m in by_column[c]))
    # Seeds are per pair of methods: a trained method meets the reference only on the seeds
    # both have, an untrained one on every seed of the reference.
    rows = [[m, *(interval(by_column[c][m]) if m in by_column[c] else "–" for c in columns),
             "/".join(dict.fromkeys(sample_size(by_column[c][m]) for c in columns if m in by_column[c]))]
            for m in others]
    unclear = [f"{m} ({c})" for c in columns for m, v in by_column[c].items() if not v["excludes_zero"]]
    plain = ("The 95% interval includes zero — no significant difference — for: " + ", ".join(unclear)
             if unclear else "Every 95% interval excludes zero.")
    return (f"\nPaired difference `{reference}` − other, percentage points, with the 95% "
            f"bootstrap interval:\n\n{table(['other', *columns, 'seeds × episodes'], rows)}\n{plain}\n")


def best_rule_section(report: dict[str, Any]) -> str:
    """The learned policy's own contribution: the reference − the best rule, scope by scope."""
    ref, rule = report["reference"], report["vs_best_rule"]
    scoped = [*((col, c) for col, c in rule["table2"].items()),
              *((f"p = {p}", c) for p, c in rule["load_sweep"].items()),
              *([("stress", rule["stress"])] if rule["stress"] else [])]
    out = [f"## The learned policy's own contribution: {ref} − the best rule\n"]
    if not scoped:
        out.append("Not available: no hand-written rule was evaluated beside the reference.\n")
        return "\n".join(out)
    told = any(SPECS[m].kind == "history" for m in rule["rules"] if m in SPECS)
    knows = (f"the hand-written methods evaluated that know what {ref} knows, the observation-only "
             f"rules and, since {ref} is told job kinds, those told them too"
             if told else "the hand-written, observation-only methods evaluated")
    out.append(f"Rules: {knows} ({', '.join(rule['rules'])}). "
               f"In each scope the rule compared is the one with the highest mean success there, so "
               f"this is the hardest of the comparisons with a rule. Scopes: each task set and their "
               f"mean at p = {report['main_load']:g}, each load of the sweep (on "
               f"{', '.join(report['load_sweep']['task_sets'])}), the stress scenario. Success %, and "
               f"the paired difference in percentage points with its 95% bootstrap interval:\n")
    out.append(table(["scope", "best rule", "rule %", f"{ref} %", f"{ref} − rule", "seeds × episodes"],
                     [[scope, c["rule"], pct(c["rule_mean"]), pct(c["reference_mean"]), interval(c),
                       sample_size(c)] for scope, c in scoped]))
    variants = report.get("variants_vs_best_rule", {})
    if len(variants.get("rows", {})) > 1:
        out.append(f"Every learned variant against the best of the rules it is measured against (the "
                   f"observation-only rules; for a variant told job kinds, those told them too), on "
                   f"`{variants['scope']}` at p = {report['main_load']:g}:\n")
        out.append(table(["variant", "best rule", "rule %", "variant %", "variant − rule", "seeds × episodes"],
                         [[m, c["rule"], pct(c["rule_mean"]), pct(c["reference_mean"]), interval(c),
                           sample_size(c)] for m, c in variants["rows"].items()]))
    return "\n".join(out)


def diagnostic_cell(value: float | None, scale: float, digits: int) -> str:
    return "–" if value is None else f"{value * scale:.{digits}f}"


def render(report: dict[str, Any], profile: str) -> str:
    """The Markdown report, every number formatted from `report`'s values."""
    ref = report["reference"]
    boot = report["bootstrap"]
    out = [f"# MARA evaluation report — profile `{profile}`\n"]
    if report["reference_note"]:
        out.append(f"> {report['reference_note']}\n")
    if ref:
        out.append(best_rule_section(report))
    if report.get("targets"):
        out.append("## Targets\n")
        out.append(table(["target", "met", "here"], [[t["target"], "yes" if t["met"] else "**no**",
                                                      t["evidence"]] for t in report["targets"]]))

    out.append("## Table 1 — predictor (stage one)\n")
    if report["predictor"]:
        if any(r["predictor"] == "recall" for r in report["predictor"]):
            out.append("`recall`: FM with its own training runs as a memory, read by the job kind the prefix "
                       "reveals, FM where no remembered run matches (docs/design.md §5.6); the paper's inputs.\n")
        if any(r["predictor"] == "history" for r in report["predictor"]):
            out.append("`history`: told each task's job kind and reading earlier runs of it (docs/design.md "
                       "§5.5), a setting beyond the paper's; its samples are its nearest runs' crossings.\n")
        out.append(predictor_table(report["predictor"]))
    else:
        out.append("Not available: run `mara eval-predictor` first.\n")

    t2 = report["table2"]
    out.append(f"## Table 2 — end-to-end success rate (%), p = {report['main_load']:g}\n")
    told_kinds = [m for m in t2["rows"] if m in SPECS and SPECS[m].kind == "history"]
    out.append("Mean ± sample std over seed × root combinations; `mean` weighs the task sets equally."
               + (f" {', '.join(told_kinds)}: told each task's job kind and reading earlier runs of it "
                  "(docs/design.md §5.5), so counted among the rules only against a learned variant told "
                  "job kinds too."
                  if told_kinds else "") + "\n")
    out.append(table(["method", *t2["columns"]],
                     [[m, *(mean_pm_std(cells[c]) if c in cells else "–" for c in t2["columns"])]
                      for m, cells in t2["rows"].items()]))
    if report["table2_seeds"]:
        out.append("\nPer training seed (mean over roots), for methods trained with several seeds:\n\n")
        out.append(table(["method", "seed", *t2["columns"]],
                         [[m, seed, *(f"{100 * cells[c]:.2f}" if c in cells else "–" for c in t2["columns"])]
                          for m, by_seed in report["table2_seeds"].items() for seed, cells in by_seed.items()]))
    if ref:
        out.append(comparison_section(report["table2_comparisons"], ref))

    t3 = report["table3"]
    out.append("## Table 3 — stress scenario\n")
    if t3["rows"]:
        out.append(f"Task sets: {', '.join(t3['task_sets'])}.\n")
        out.append(table(["method", "success %", "tasks/episode"],
                         [[m, mean_pm_std(c), f"{c['tasks_per_episode']:.2f}"]
                          for m, c in t3["rows"].items()]))
        if ref:
            out.append(comparison_section({"stress": report["table3_comparisons"]}, ref))
    else:
        out.append("Not evaluated.\n")

    sweep = report["load_sweep"]
    out.append("## Figure 4 — load sweep\n")
    if sweep["rows"]:
        cols = [f"{p:g}" for p in sweep["loads"]]
        first = next(iter(sweep["rows"].values()))
        out.append(f"Success % per arrival probability p on {', '.join(sweep['task_sets'])}.\n")
        rows = [[m, *(mean_pm_std(c[p]) if p in c else "–" for p in cols)]
                for m, c in sweep["rows"].items()]
        rows.append(["tasks/episode", *(f"{first[p]['tasks_per_episode']:.2f}" if p in first else "–"
                                        for p in cols)])
        out.append(table(["method", *(f"p = {p}" for p in cols)], rows))
        out.append(f"\n![success vs load]({SWEEP_PNG})\n")
        if ref:
            out.append(comparison_section({f"p = {p}": c for p, c in
                                           report["load_sweep_comparisons"].items()}, ref))
    else:
        out.append("Not evaluated (needs more than one load).\n")

    out.append(f"## Table 4 — diagnostics, p = {report['main_load']:g} (mean over task sets and "
               "seeds)\n")
    out.append(table(["method", "utilisation %", "full queue %", "waiting tasks", "steps to 4 obs."],
                     [[m, diagnostic_cell(d["utilisation"], 100, 1),
                       diagnostic_cell(d["full_queue_fraction"], 100, 1),
                       diagnostic_cell(d["waiting_population"], 1, 2),
                       diagnostic_cell(d["readiness_steps"], 1, 1)] for m, d in report["table4"].items()]))
    bands = slack_bands()
    out.append("\nFeasible tasks completed (%) by slack = window − batches the task truly needs "
               "(the Oracle bound completes them all):\n\n")
    out.append(table(["method", *(f"slack ≥ {lo}" if hi == math.inf else f"slack {lo}–{hi}" for _, lo, hi in bands)],
                     [[m, *(diagnostic_cell(d.get(key), 100, 1) for key, _, _ in bands)]
                      for m, d in report["table4"].items() if m != "oracle"]))

    if any(report[k] for k in ("table2_comparisons", "table3_comparisons", "load_sweep_comparisons")):
        out.append(f"\n![paired differences]({COMPARISON_PNG})\n")
    out.append("## Pairing and bootstrap\n")
    out.append(f"Every method ran on the same frozen episodes. A comparison pairs, in each task "
               f"set, the two methods' success on every training seed × episode; a method without "
               f"a seed counts the same for every seed, and two trained methods meet on the seeds "
               f"they share. Each bootstrap resample draws the seeds with replacement and, "
               f"independently, the episodes with replacement inside each task set, and averages "
               f"the differences over drawn seeds × drawn episodes (the `mean` column: per task "
               f"set, then with equal weight over the task sets); seed-episode cells are never "
               f"drawn one by one. The interval is the percentile interval of {boot['resamples']} "
               f"resamples, level {boot['level']:g}, seed {boot['seed']}. With one seed this is "
               f"the bootstrap over episodes.\n")
    if report.get("inputs"):
        out.append(inputs_section(report["inputs"]))
    return "\n".join(out)


def inputs_section(inputs: dict[str, Any]) -> str:
    """The digests and the machine behind the figures, to check a rebuild against."""
    def cell(values: list[str]) -> str:
        return ", ".join(f"`{v}`" for v in values) + (" (differs between evaluations)" if len(values) > 1 else "")

    rows = [["bank", cell(inputs["bank"])]]
    rows += [[f"predictor {kind}", cell(v)] for kind, v in inputs["predictors"].items()]
    rows += [[f"policy {label}", cell(v)] for label, v in inputs["policies"].items()]
    machines = "; ".join(f"{m['processor']} ({m['vector']}), kernels {m['kernels']}, torch {m['torch']}, "
                         f"numpy {m['numpy']}" for m in inputs["machine"])
    return ("## Inputs\n\nContent digests (SHA-256, first 16 hex digits) of the files these figures were "
            "computed from: the bank, the predictors read from files, each trained policy's weights. A "
            "rebuild with the same digests, evaluated on a machine that agrees in every item of the last "
            "line, gives the same figures.\n\n" + table(["input", "digest"], rows)
            + f"\nComputed on: {machines}.\n")


# ---------------------------------------------------------------- figures
def plot_sweep(report: dict[str, Any], path: Path) -> Path:
    sweep = report["load_sweep"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = plt.get_cmap("tab20").colors  # distinct for up to 20 methods
    for i, (method, cells) in enumerate(sweep["rows"].items()):
        loads = [p for p in sweep["loads"] if f"{p:g}" in cells]
        mean = [100 * cells[f"{p:g}"]["mean"] for p in loads]
        std = [100 * cells[f"{p:g}"]["std"] for p in loads]
        # References told the true demand (and the bound) dashed: not schedulers one can run.
        style = "--" if method in SPECS and SPECS[method].kind != "rule" else "-"
        ax.errorbar(loads, mean, yerr=std, marker="o", capsize=3, label=method, ls=style,
                    color=colours[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20])
    ax.set(xlabel="arrival probability p", ylabel="success rate (%)",
           title=f"Success vs load ({', '.join(sweep['task_sets'])})")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return save_figure(fig, path)


def plot_comparisons(report: dict[str, Any], path: Path) -> Path:
    """Every paired difference with its interval: which ones clear zero, at a glance."""
    scoped = [(f"{col}", report["table2_comparisons"][col]) for col in report["table2_comparisons"]]
    scoped.append(("stress", report["table3_comparisons"]))
    scoped += [(f"p={p}", c) for p, c in report["load_sweep_comparisons"].items()]
    items = [(f"{m} · {scope}", c) for scope, comps in scoped for m, c in comps.items()]
    fig, ax = plt.subplots(figsize=(6.5, 0.28 * len(items) + 1.2))
    for y, (_, c) in enumerate(items):
        colour = "tab:blue" if c["excludes_zero"] else "tab:grey"
        # A percentile interval of resamples need not contain the full-sample mean (a few seeds,
        # discrete outcomes): the bar then stops at the mean on that side.
        below, above = max(c["mean"] - c["low"], 0.0), max(c["high"] - c["mean"], 0.0)
        ax.errorbar(100 * c["mean"], y, xerr=[[100 * below], [100 * above]], fmt="o", color=colour, capsize=2)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(items)), [label for label, _ in items], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel=f"{report['reference']} − other (percentage points, 95% CI)")
    return save_figure(fig, path)


# ---------------------------------------------------------------- entry point
def write_report(records: list[Record], out_dir: Path, profile: str,
                 cfg: ReportConfig = ReportConfig(), predictor_eval: Path | None = None,
                 log_mlflow: bool = True, publish_to: Path | None = None,
                 inputs: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.json, report.md and PNGs into `out_dir`; logged to `mara-evaluation`. With
    `publish_to`, report.md and the PNGs are copied there (the tracked `results/<profile>/`)
    and, for the default profile, the README's results block is rewritten from them.
    `inputs` (`load_inputs`) closes the report with what the figures were computed from."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pred = json.loads(predictor_eval.read_text()) if predictor_eval and predictor_eval.exists() else None
    report = {**build(records, cfg, pred), "inputs": inputs or {}}
    (out_dir / REPORT_JSON).write_text(json.dumps(report, indent=1))
    text = render(report, profile)
    if (out_dir / TIMELINE_PNG).exists():  # written by the pipeline's timeline stage
        text += ("\n## One test episode, node by node\n\nWhich task each node served at each step, one "
                 "panel per method (learned methods: their first seed); hatched: restoring.\n\n"
                 f"![per-node timeline]({TIMELINE_PNG})\n")
    (out_dir / REPORT_MD).write_text(text)
    files = [out_dir / REPORT_JSON, out_dir / REPORT_MD]
    if report["load_sweep"]["rows"]:
        files.append(plot_sweep(report, out_dir / SWEEP_PNG))
    if report["reference"]:
        files.append(plot_comparisons(report, out_dir / COMPARISON_PNG))
    if (out_dir / TIMELINE_PNG).exists():  # written by the pipeline's timeline stage
        files.append(out_dir / TIMELINE_PNG)
    if publish_to is not None:
        publish(report, files, publish_to, profile)
    if log_mlflow:
        log_report(report, files, profile)
    return report


def headline(report: dict[str, Any], profile: str) -> str:
    """The README's results block: Table 2's success rates (mean over seeds × roots)."""
    t2 = report["table2"]
    rows = [[m, *(pct(cells[c]["mean"]) if c in cells else "–" for c in t2["columns"])]
            for m, cells in t2["rows"].items()]
    text = (f"Success rate (%) on the frozen test episodes at p = {report['main_load']:g}, profile "
            f"`{profile}` (generated by `make report`; intervals and the other tables in "
            f"[results/{profile}/report.md](results/{profile}/report.md)):\n\n"
            + table(["method", *t2["columns"]], rows))
    best = (report.get("vs_best_rule") or {}).get("table2", {}).get(MEAN)
    if best:
        text += (f"\n{report['reference']} − the best hand-written rule ({best['rule']}) on the mean: "
                 f"{interval(best)} points.\n")
    return text


def publish(report: dict[str, Any], files: list[Path], dest: Path, profile: str,
            readme: Path = README) -> None:
    """Copy the Markdown report and its figures to `dest`; for the default profile, refresh
    the results block of `readme`."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        if f.suffix in (".md", ".png"):
            shutil.copyfile(f, dest / f.name)
    if profile == "default" and readme.exists():
        text = readme.read_text()
        begin, end = text.find(RESULTS_BEGIN), text.find(RESULTS_END)
        if 0 <= begin < end:
            block = f"{RESULTS_BEGIN}\n{headline(report, profile)}{RESULTS_END}"
            readme.write_text(text[:begin] + block + text[end + len(RESULTS_END):])


def log_report(report: dict[str, Any], files: list[Path], profile: str) -> None:
    """The report run (files, every Table 2 cell and difference), and one `table2` run per
    method whose metrics are its Table 2 row: the compare view of those runs is Table 2."""
    import mlflow

    with mlflow_run(EVAL_EXPERIMENT, f"report · {profile}",
                    {"kind": "report", "profile": profile, "reference": report["reference"]}):
        metrics = {f"table2.{m}.{col}": c["mean"] for m, cells in report["table2"]["rows"].items()
                   for col, c in cells.items()}
        metrics |= {f"diff.{report['reference']}-{m}.{col}": c["mean"]
                    for col, comps in report["table2_comparisons"].items() for m, c in comps.items()}
        metrics |= {f"diff.{report['reference']}-best_rule.{col}": c["mean"]
                    for col, c in report["vs_best_rule"]["table2"].items()}
        variants = report["variants_vs_best_rule"]
        metrics |= {f"diff.{m}-best_rule.{variants['scope']}": c["mean"] for m, c in variants["rows"].items()}
        mlflow.log_metrics(metrics)
        for f in files:
            mlflow.log_artifact(str(f))
    for method, cells in report["table2"]["rows"].items():
        tags = {"kind": "table2", "profile": profile, "method": method}
        query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
        found = mlflow.search_runs(experiment_names=[EVAL_EXPERIMENT], filter_string=query,
                                   max_results=1, output_format="list")
        with mlflow_run(EVAL_EXPERIMENT, f"table2 · {method} · {profile}", tags,
                        run_id=found[0].info.run_id if found else None):
            mlflow.log_metrics({col: 100 * c["mean"] for col, c in cells.items()})
