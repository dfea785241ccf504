"""The evaluation report on a tiny smoke evaluation: tables, figures, JSON ↔ Markdown, paired CIs.

No scheduler is trained here: "mara" is EDF run under two fake training
seeds, which exercises the seed pairing and, since it decides exactly like
EDF, gives a method-against-itself comparison; "idle" never serves a node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest

from mara_common.config import ConfigError
from mara_common.kernels import machine
from mara_common.paths import PROFILE_DIR
from mara_common.profile import Profile
from mara_env.env import EnvConfig
from mara_fm.bank import bank_digest
from mara_fm.predictors import predictor_digest
from mara_fm.predictors.recall import MEMORY_FILE
from mara_rl import evaluate as evaluate_module
from mara_rl.cli import main
from mara_rl.evaluate import EvalConfig, evaluate, slack_bands
from mara_rl.mat_module import MATConfig
from mara_rl.methods import BUILTIN, VARIANTS, Method, builtin_methods, classic, learned
from mara_rl.pipeline import (
    PipelineConfig,
    Stage,
    bank_stage,
    evaluate_all,
    evaluation_stages,
    predictor_eval_stage,
    run_stages,
    scheduler_stage,
    variant_config,
)
from mara_rl.policy import export_policy, module_spec, policy_digest
from mara_rl.provenance import evaluation_inputs, load_inputs
from mara_rl.records import CELL_JOURNAL, Record, write_results
from mara_rl.report import (
    MEAN,
    RESULTS_BEGIN,
    RESULTS_END,
    ReportConfig,
    build,
    choose_reference,
    compare,
    inputs_section,
    interval,
    mean_pm_std,
    method_names,
    plot_comparisons,
    publish,
    render,
    scores,
    write_report,
)
from mara_rl.run_state import STATE_FILE, comparable, run_inputs
from mara_rl.scheduler_config import training_env
from mara_rl.stats import difference_matrix, hierarchical_bootstrap, mean_std

TASK_SETS = ["id", "rl_ood", "vit_ood"]
IDLE = Method("idle", "wls", lambda: lambda obs, envs: np.zeros((len(envs), envs[0].cfg.n_nodes), np.int64))
PREDICTOR_EVAL = [{"task_set": "id", "predictor": "fm", "n_queries": 12, "capped_mae": 10.5,
                   "budget_accuracy": 0.75, "mae_reduction_vs_wls": 0.25, "ms_per_prefix": 0.01,
                   "ms_per_call_7": 0.2},
                  {"task_set": "id", "predictor": "wls", "n_queries": 12, "capped_mae": 14.0,
                   "budget_accuracy": 0.70, "ms_per_prefix": 0.002, "ms_per_call_7": 0.05}]


@pytest.fixture(scope="module")
def records(smoke_bank: Path) -> list[Record]:
    builtin = builtin_methods(None, {"optimistic_quantile": 0.15})
    methods = [Method("mara", "wls", classic("edf"), seed=s) for s in (0, 1)]
    methods += [builtin[m] for m in ("lara", "fifo", "edf", "lara_oracle", "llf_oracle", "oracle")] + [IDLE]
    env_cfg, eval_cfg = EnvConfig(bank=str(smoke_bank)), EvalConfig(roots=2, episodes_per_root=1)

    def run(task_sets: list[str], loads: list[float], scenario: str = "default") -> list[Record]:
        return evaluate(methods, task_sets, loads, smoke_bank, env_cfg, eval_cfg, scenario=scenario,
                        log_mlflow=False, progress=False)

    return run(TASK_SETS, [0.04]) + run(["id"], [0.04], "stress") + run(["id"], [0.05, 0.06, 0.07])


@pytest.fixture(scope="module")
def written(records: list[Record], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    (out / "predictor_eval.json").write_text(json.dumps(PREDICTOR_EVAL))
    write_report(records, out, "smoke", predictor_eval=out / "predictor_eval.json", log_mlflow=False)
    return out


def md_row(markdown: str, first_cell: str, after: str) -> str:
    """The table row starting with `first_cell` in the first table after heading text `after`."""
    tail = markdown[markdown.index(after):]
    return next(line for line in tail.splitlines() if line.startswith(f"| {first_cell} |"))


def test_every_table_and_figure_is_written(written: Path) -> None:
    md = (written / "report.md").read_text()
    for heading in ("Table 1", "Table 2", "Table 3", "Figure 4", "Table 4", "Pairing and bootstrap"):
        assert f"## {heading}" in md
    for png in ("load_sweep.png", "comparisons.png"):
        assert (written / png).stat().st_size > 1000 and f"]({png})" in md
    report = json.loads((written / "report.json").read_text())
    assert report["table2"]["columns"] == [*TASK_SETS, MEAN]
    assert report["load_sweep"]["loads"] == [0.04, 0.05, 0.06, 0.07]
    assert report["load_sweep"]["task_sets"] == ["id"]
    assert set(report["table3"]["rows"]) == {"mara", "lara", "fifo", "edf", "lara_oracle", "llf_oracle", "oracle",
                                                  "idle"}
    assert report["table4"]["oracle"]["utilisation"] is None  # not simulated: shown as "–"
    assert "| id | fm | 12 | 10.50 |" in md  # stage one's table, formatted by its own module


def test_markdown_numbers_come_from_the_json(written: Path) -> None:
    md = (written / "report.md").read_text()
    report = json.loads((written / "report.json").read_text())
    for method, cells in report["table2"]["rows"].items():
        row = md_row(md, method, "## Table 2")
        assert row == f"| {method} | " + " | ".join(mean_pm_std(cells[c]) for c in report["table2"]["columns"]) + " |"
    for col, comps in report["table2_comparisons"].items():
        for method, c in comps.items():
            assert interval(c) in md_row(md, method, "Paired difference"), (col, method)
    for method, c in report["table3"]["rows"].items():
        assert md_row(md, method, "## Table 3").startswith(f"| {method} | {mean_pm_std(c)} |")
    for method, cells in report["load_sweep"]["rows"].items():
        row = md_row(md, method, "## Figure 4")
        assert all(mean_pm_std(cells[p]) in row for p in cells)
    tasks = md_row(md, "tasks/episode", "## Figure 4")
    assert f"{report['load_sweep']['rows']['fifo']['0.07']['tasks_per_episode']:.2f}" in tasks
    d = report["table4"]["lara"]
    assert md_row(md, "lara", "## Table 4") == (
        f"| lara | {100 * d['utilisation']:.1f} | {100 * d['full_queue_fraction']:.1f} | "
        f"{d['waiting_population']:.2f} | {d['readiness_steps']:.1f} |")
    bands = [d[key] for key, _, _ in slack_bands()]
    assert any(v is not None for v in bands)
    assert md_row(md, "lara", "Feasible tasks completed") == "| lara | " + " | ".join(
        "–" if v is None else f"{100 * v:.1f}" for v in bands) + " |"


def test_comparisons_pair_seeds_and_episodes_and_std_is_over_seed_by_root(records: list[Record],
                                                                           written: Path) -> None:
    report = json.loads((written / "report.json").read_text())
    assert report["table2"]["rows"]["mara"]["id"]["n"] == 4  # 2 seeds × 2 roots
    assert report["table2"]["rows"]["lara"]["id"]["n"] == 2
    c = report["table2_comparisons"]["id"]["lara"]  # LARA counts for both of mara's seeds
    assert (c["seeds"], c["episodes"]) == (2, 2)  # 2 roots × 1 episode
    c = report["table2_comparisons"][MEAN]["lara"]
    assert (c["seeds"], c["episodes"]) == (2, 6)  # each task set's episodes, kept apart
    assert "| lara | " in (written / "report.md").read_text() and "| 2 × 2/2 × 6 |" in \
        md_row((written / "report.md").read_text(), "lara", "Paired difference")
    per_seed = report["table2_seeds"]["mara"]
    assert set(per_seed) == {"0", "1"} and "lara" not in report["table2_seeds"]
    overall = report["table2"]["rows"]["mara"]["id"]["mean"]
    assert np.mean([per_seed[s]["id"] for s in per_seed]) == pytest.approx(overall)
    md = (written / "report.md").read_text()
    assert f"| mara | 1 | {100 * per_seed['1']['id']:.2f} |" in md
    ids = [r for r in records if r.method == "lara" and r.task_set in TASK_SETS and r.load == 0.04
           and r.scenario == "default"]
    per_root = np.mean([r.per_root for r in ids], axis=0)  # equal-weight mean of the task sets
    assert report["table2"]["rows"]["lara"][MEAN]["mean"] == pytest.approx(mean_std(per_root)[0])
    assert report["table2"]["rows"]["lara"][MEAN]["std"] == pytest.approx(np.std(per_root, ddof=1))


def test_mixing_validation_and_test_results_is_refused(records: list[Record]) -> None:
    val = [dataclasses.replace(r, split="val") for r in records[:3]]
    with pytest.raises(ValueError, match="mix episodes of the splits"):
        build(records + val)


def test_a_method_against_itself_is_exactly_zero(written: Path) -> None:
    report = json.loads((written / "report.json").read_text())
    x = np.random.default_rng(3).random(30)
    same = hierarchical_bootstrap(difference_matrix({0: x, 1: x[::-1]}, {0: x, 1: x[::-1]}))
    assert (same.mean, same.low, same.high, same.excludes_zero) == (0.0, 0.0, 0.0, False)
    # "mara" decides exactly like EDF, under both of its seeds.
    for comps in [*report["table2_comparisons"].values(), report["table3_comparisons"]]:
        c = comps["edf"]
        assert (c["mean"], c["low"], c["high"], c["excludes_zero"]) == (0.0, 0.0, 0.0, False)
    assert "edf (id)" in (written / "report.md").read_text()  # listed as including zero


def test_idle_is_significantly_worse_than_every_method(records: list[Record], written: Path) -> None:
    report = json.loads((written / "report.json").read_text())
    for col, comps in report["table2_comparisons"].items():
        assert comps["idle"]["excludes_zero"] and comps["idle"]["low"] > 0, col
    for task_sets in ([t] for t in TASK_SETS):
        idle = scores(records, "idle", "default", 0.04, task_sets)
        assert idle is not None and all(np.all(v == 0) for by_seed in idle.episodes.values()
                                        for v in by_seed.values())
        for method in ("lara", "fifo", "edf", "oracle"):
            diff = compare(scores(records, method, "default", 0.04, task_sets), idle, ReportConfig().bootstrap)
            assert diff["excludes_zero"] and diff["mean"] > 0, (method, task_sets)


def test_the_mean_column_resamples_each_task_set_apart(records: list[Record]) -> None:
    """The mean column's interval is the hierarchical bootstrap of the per-task-set matrices."""
    mara, lara = (scores(records, m, "default", 0.04, TASK_SETS) for m in ("mara", "lara"))
    got = compare(mara, lara, ReportConfig().bootstrap)
    want = hierarchical_bootstrap([difference_matrix(mara.episodes[t], lara.episodes[t]) for t in TASK_SETS])
    assert (got["mean"], got["low"], got["high"]) == (want.mean, want.low, want.high)
    assert got["mean"] == pytest.approx(mara.summary()["mean"] - lara.summary()["mean"])


def synthetic(method: str, task_set: str, level: float, seed: int | None = None, load: float = 0.04,
              scenario: str = "default") -> Record:
    """A record of 2 roots × 2 episodes, averaging `level` + 0.0025."""
    episodes = [level + d for d in (0.0, 0.02, -0.02, 0.01)]
    roots = [float(np.mean(episodes[:2])), float(np.mean(episodes[2:]))]
    return Record(method, task_set, load, scenario, float(np.mean(roots)), float(np.std(roots, ddof=1)),
                  roots, episodes, 20.0, seed=seed)


# Per scope: (fifo, edf, lara) success, then mara's; references and the bound sit above every rule.
SCOPES = {("id", 0.04, "default"): ((0.2, 0.5, 0.4), 0.55),  # best rule: edf
          ("rl_ood", 0.04, "default"): ((0.1, 0.3, 0.6), 0.65),  # lara
          ("vit_ood", 0.04, "default"): ((0.7, 0.2, 0.3), 0.75),  # fifo; the mean: lara (43.3 %)
          ("id", 0.05, "default"): ((0.3, 0.1, 0.2), 0.35),  # fifo
          ("id", 0.06, "default"): ((0.1, 0.2, 0.4), 0.3),  # lara, above mara
          ("id", 0.04, "stress"): ((0.0, 0.3, 0.1), 0.6)}  # edf


@pytest.fixture(scope="module")
def best_rule_report() -> dict:
    records = []
    for (task_set, load, scenario), (rules, mara) in SCOPES.items():
        at = {"load": load, "scenario": scenario}
        records += [synthetic(m, task_set, v, **at) for m, v in zip(("fifo", "edf", "lara"), rules, strict=True)]
        records += [synthetic("mara", task_set, mara + 0.02 * s, seed=s, **at) for s in (0, 1)]
        records += [synthetic(m, task_set, 0.9, **at) for m in ("lara_oracle", "oracle")]
    return build(records)


def test_the_learned_policy_is_compared_with_the_best_rule_of_each_scope(best_rule_report: dict) -> None:
    report = best_rule_report
    rule = report["vs_best_rule"]
    assert rule["rules"] == ["fifo", "edf", "lara"]  # the registry's rules that were evaluated
    assert {col: c["rule"] for col, c in rule["table2"].items()} == \
        {"id": "edf", "rl_ood": "lara", "vit_ood": "fifo", MEAN: "lara"}
    assert {p: c["rule"] for p, c in rule["load_sweep"].items()} == {"0.04": "edf", "0.05": "fifo", "0.06": "lara"}
    assert rule["stress"]["rule"] == "edf"
    for col, c in rule["table2"].items():  # the same numbers as that rule's row of the comparisons
        assert {k: c[k] for k in ("mean", "low", "high", "seeds", "episodes")} == \
            {k: report["table2_comparisons"][col][c["rule"]][k] for k in ("mean", "low", "high", "seeds", "episodes")}
        assert c["rule_mean"] == max(report["table2"]["rows"][m][col]["mean"] for m in rule["rules"])
        assert c["reference_mean"] == report["table2"]["rows"]["mara"][col]["mean"]
    assert rule["table2"][MEAN]["mean"] == pytest.approx(np.mean([0.56, 0.66, 0.76]) - np.mean([0.4, 0.6, 0.3]))
    targets = {t["target"]: t for t in report["targets"]}
    on_mean = targets["mara − best rule ≥ +1.5 points on the mean, CI excluding 0"]
    assert on_mean["met"] and on_mean["evidence"].endswith("vs lara")
    sweep = targets["mara − best rule ≥ 0 at every load of the sweep"]
    assert not sweep["met"] and "p = 0.06: -9.00 vs lara" in sweep["evidence"]
    oracle = targets["gap to the Oracle bound on the mean ≤ 4.0 points"]
    assert not oracle["met"] and oracle["evidence"].startswith(f"{100 * (0.9 - np.mean([0.56, 0.66, 0.76])):.2f} [")


def test_a_variant_told_job_kinds_is_measured_against_the_rules_told_them_too() -> None:
    """mara_history's best rule includes the history rules (here the best one); mara's does not."""
    records = []
    for task_set in TASK_SETS:
        records += [synthetic("edf", task_set, 0.4), synthetic("lara_history_optimistic", task_set, 0.6)]
        records += [synthetic(m, task_set, 0.62 + 0.01 * s, seed=s) for m in ("mara", "mara_history")
                    for s in (0, 1)]
    told = build(records, ReportConfig(reference="mara_history"))
    assert told["vs_best_rule"]["rules"] == ["edf", "lara_history_optimistic"]
    assert told["vs_best_rule"]["table2"][MEAN]["rule"] == "lara_history_optimistic"
    assert "those told them too (edf, lara_history_optimistic)" in render(told, "synthetic")
    blind = build(records, ReportConfig(reference="mara"))
    assert blind["vs_best_rule"]["rules"] == ["edf"]
    assert blind["vs_best_rule"]["table2"][MEAN]["rule"] == "edf"
    # Whichever is the reference, each variant also meets its own rules, in the same table.
    for report in (told, blind):
        variants = report["variants_vs_best_rule"]
        assert variants["scope"] == MEAN
        assert {m: c["rule"] for m, c in variants["rows"].items()} == \
            {"mara": "edf", "mara_history": "lara_history_optimistic"}
        ref = report["reference"]
        assert variants["rows"][ref] == report["vs_best_rule"]["table2"][MEAN]
        c = variants["rows"]["mara_history"]
        assert c["mean"] == pytest.approx(np.mean([0.6225, 0.6325]) - 0.6025)
        assert md_row(render(report, "synthetic"), "mara_history", "## The learned policy") == \
            f"| mara_history | lara_history_optimistic | 60.25 | {100 * c['reference_mean']:.2f} | {interval(c)} | 2 × 12 |"


def test_the_best_rule_section_comes_first(best_rule_report: dict, written: Path) -> None:
    for md in (render(best_rule_report, "synthetic"), (written / "report.md").read_text()):
        headings = [line for line in md.splitlines() if line.startswith("## ")]
        assert headings[:2] == ["## The learned policy's own contribution: mara − the best rule",
                                "## Targets"]
    md = render(best_rule_report, "synthetic")
    c = best_rule_report["vs_best_rule"]["table2"][MEAN]
    assert md_row(md, MEAN, "## The learned policy") == \
        f"| {MEAN} | lara | 43.58 | {100 * c['reference_mean']:.2f} | {interval(c)} | 2 × 12 |"
    assert md_row(md, "stress", "## The learned policy").startswith("| stress | edf | 30.25 |")
    assert md_row(md, "p = 0.06", "## The learned policy").startswith("| p = 0.06 | lara |")


def test_reference_fallback(records: list[Record]) -> None:
    assert choose_reference(["fifo", "idle", "mara"], "mara") == ("mara", "")
    ref, note = choose_reference(["fifo", "idle"], "mara")
    assert ref == "idle" and "instead" in note
    classic_only = [r for r in records if r.method in ("fifo", "edf", "oracle")]
    report = build(classic_only)
    assert report["reference"] is None and report["table2_comparisons"][MEAN] == {}
    assert "skipped" in report["reference_note"]


def test_report_cli_logs_a_run_with_the_files(records: list[Record], smoke_bank: Path, tmp_path: Path,
                                              mlflow_store: str) -> None:
    write_results(records, tmp_path / "eval" / "all", evaluation_inputs([], smoke_bank))
    argv = ["report", "--profile", "smoke", "--eval-dir", str(tmp_path / "eval"), "--out",
            str(tmp_path / "out"), "--predictor-eval", str(tmp_path / "absent.json"), "--no-publish"]
    main(argv)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Not available" in md and f"| bank | `{bank_digest(smoke_bank)}` |" in md
    mlflow.set_tracking_uri(mlflow_store)
    runs = mlflow.search_runs(experiment_names=["mara-evaluation"], output_format="list")
    (run,) = [r for r in runs if r.data.tags["kind"] == "report"]
    assert run.info.run_name == "report · smoke" and "table2.mara.mean" in run.data.metrics
    files = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)}
    assert {"report.md", "report.json", "load_sweep.png", "comparisons.png"} <= files
    # One run per method whose metrics are its Table 2 row: the compare view is Table 2.
    table2 = {r.data.tags["method"]: r for r in runs if r.data.tags["kind"] == "table2"}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert set(table2) == set(report["table2"]["rows"])
    variants = report["variants_vs_best_rule"]
    assert variants["rows"] and all(run.data.metrics[f"diff.{m}-best_rule.{variants['scope']}"] ==
                                    pytest.approx(c["mean"]) for m, c in variants["rows"].items())
    for method, cells in report["table2"]["rows"].items():
        assert table2[method].data.metrics == pytest.approx({c: 100 * v["mean"] for c, v in cells.items()})
        assert table2[method].data.tags["profile"] == "smoke"
    main(argv)  # a second report updates those runs instead of adding more
    again = mlflow.search_runs(experiment_names=["mara-evaluation"], filter_string="tags.kind = 'table2'",
                               output_format="list")
    assert {r.info.run_id for r in again} == {r.info.run_id for r in table2.values()}


def test_report_publishes_its_tables_and_the_readme_block(written: Path, tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{RESULTS_BEGIN}\nstale\n{RESULTS_END}\n\nafter\n")
    report = json.loads((written / "report.json").read_text())
    publish(report, [written / "report.md", written / "report.json", written / "load_sweep.png"],
            tmp_path / "results", "default", readme)
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["load_sweep.png", "report.md"]
    text = readme.read_text()
    assert "stale" not in text and text.startswith("# title") and text.endswith("after\n")
    block = text[text.index(RESULTS_BEGIN):text.index(RESULTS_END)]
    mara = report["table2"]["rows"]["mara"][MEAN]["mean"]
    assert "| mara | " in block and f"{100 * mara:.2f} |" in block


def test_stages_with_current_outputs_are_skipped(tmp_path: Path) -> None:
    """Skipped: an output newer than its inputs. Rerun: a missing output, or one older than an input."""
    ran: list[str] = []
    source, done, outdated = tmp_path / "in.json", tmp_path / "done.json", tmp_path / "outdated.json"
    for path, mtime in ((outdated, 1_000), (source, 2_000), (done, 3_000)):
        path.write_text("{}")
        os.utime(path, (mtime, mtime))
    run_stages([Stage("done", done, lambda: ran.append("done"), (source,)),
                Stage("outdated", outdated, lambda: ran.append("outdated"), (source,)),
                Stage("new", tmp_path / "new.json", lambda: ran.append("new"))], progress=False)
    assert ran == ["outdated", "new"]


def test_a_predictor_evaluation_without_the_history_predictor_is_made_again(tmp_path: Path) -> None:
    """A profile with a [history_bank] scores the history predictor too, and an FM export with
    its memory the recall predictor: an earlier evaluation that did not is not reused; a profile
    with neither has nothing to add."""
    path = tmp_path / f"history_eval_{os.getpid()}.toml"  # its evaluation goes to reports/predictor/<stem>/
    path.write_text((PROFILE_DIR / "smoke.toml").read_text())
    profile = Profile.load(path)
    stage, out = predictor_eval_stage(profile), profile.paths.predictor_eval
    assert profile.paths.history_bank in stage.inputs
    out.parent.mkdir(parents=True)
    try:
        out.write_text(json.dumps([{"predictor": "fm"}, {"predictor": "wls"}]))
        assert not stage.covers() and not stage.done()
        out.write_text(json.dumps([{"predictor": "fm"}, {"predictor": "wls"}, {"predictor": "history"}]))
        assert stage.covers()
        # An exported FM with its memory: the recall predictor is scored too.
        memory = profile.paths.predictor / MEMORY_FILE
        memory.parent.mkdir(parents=True)
        memory.write_bytes(b"")
        assert memory in stage.inputs and not stage.covers()
        out.write_text(json.dumps([{"predictor": p} for p in ("fm", "wls", "history", "recall")]))
        assert stage.covers()
    finally:
        shutil.rmtree(out.parent)
        shutil.rmtree(profile.paths.predictor.parent, ignore_errors=True)
    assert predictor_eval_stage(Profile.load("paper")).covers()


def test_a_finished_scheduler_with_other_settings_stops_the_pipeline(tmp_path: Path, smoke_bank: Path) -> None:
    """A run trained under another workload (here: the window basis) is named, not reused; one
    trained for fewer iterations than the profile now asks is continued."""
    path = tmp_path / f"stale_run_{os.getpid()}.toml"  # its runs go to artifacts/scheduler/<stem>-…
    path.write_text((PROFILE_DIR / "smoke.toml").read_text())
    profile, variant = Profile.load(path), VARIANTS[1]
    stage = scheduler_stage(profile, variant, seed=0)
    run_dir = stage.output.parent.parent
    cfg = variant_config(profile, variant, seed=0)
    state_file = run_dir / "checkpoint" / STATE_FILE
    try:
        shutil.copyfile(smoke_bank, profile.paths.bank)
        env_cfg = training_env(cfg, profile, profile.paths.bank)
        stored = {"config": comparable(cfg, env_cfg), "iteration": cfg.iterations, "inputs": run_inputs(env_cfg)}
        stage.output.parent.mkdir(parents=True)
        stage.output.write_text("{}")
        state_file.parent.mkdir()
        state_file.write_text(json.dumps(stored))
        assert stage.done()  # the same settings: reused
        state_file.write_text(json.dumps({**stored, "iteration": cfg.iterations - 1}))
        assert not stage.done()  # trained for fewer iterations than asked: continued
        stored["config"]["env.workload.window_basis"] = "target"
        state_file.write_text(json.dumps(stored))
        with pytest.raises(ConfigError, match=r"env\.workload\.window_basis.*move it aside"):
            stage.done()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        profile.paths.bank.unlink(missing_ok=True)


def test_a_bank_built_with_other_settings_stops_the_pipeline(tmp_path: Path, smoke_bank: Path) -> None:
    """Its `[bank]` edited, a profile is not served the bank built before: the bank stage names it."""
    path = tmp_path / f"stale_bank_{os.getpid()}.toml"  # its bank goes to data/banks/<stem>.parquet
    path.write_text((PROFILE_DIR / "smoke.toml").read_text())
    stage = bank_stage(Profile.load(path))
    parts = stage.output.with_suffix(".parts")
    try:
        shutil.copyfile(smoke_bank, stage.output)
        shutil.copytree(smoke_bank.with_suffix(".parts"), parts)
        assert stage.done()  # built with these settings: reused
        path.write_text((PROFILE_DIR / "smoke.toml").read_text().replace("curves_per_id_family = 6",
                                                                           "curves_per_id_family = 7", 1))
        with pytest.raises(ConfigError, match=r"stale_bank_\d+\.parquet was built with another config.*--fresh"):
            bank_stage(Profile.load(path)).done()
    finally:
        stage.output.unlink(missing_ok=True)
        shutil.rmtree(parts, ignore_errors=True)


def test_an_evaluation_missing_a_method_is_run_again(tmp_path: Path) -> None:
    """Results newer than every input are still redone when a method (or seed) is missing."""
    from dataclasses import asdict

    path = tmp_path / f"new_method_{os.getpid()}.toml"  # results go to reports/<stem>/eval
    path.write_text('extends = "smoke"\n')  # smoke's banks: its history bank is built once, not per run
    profile = Profile.load(path)
    paths = profile.paths
    policies = {("mara", 0): tmp_path / "mara" / "policy.json"}
    main = evaluation_stages(profile, PipelineConfig(), policies)[0]

    def record(method: str, seed: int | None) -> dict:
        return asdict(Record(method, "id", 0.04, "default", 0.5, 0.0, [0.5], [0.5], 20.0, seed=seed))

    everything = [record("mara", 0)] + [record(s.name, None) for s in BUILTIN]
    try:
        main.output.parent.mkdir(parents=True)
        main.output.write_text(json.dumps(everything))
        assert main.done()
        main.output.write_text(json.dumps([r for r in everything if r["method"] != "llf_oracle"]))
        assert not main.done()
        main.output.write_text(json.dumps([r for r in everything if r["method"] != "mara"]))
        assert not main.done()
    finally:
        shutil.rmtree(paths.report, ignore_errors=True)


def test_evaluate_all_names_every_untrained_variant(tmp_path: Path) -> None:
    path = tmp_path / "never_trained.toml"
    path.write_text((PROFILE_DIR / "smoke.toml").read_text())
    with pytest.raises(FileNotFoundError, match=r"mara \(seed 0\).*mara_wls \(seed 0\).*sparse \(seed 0\)"):
        evaluate_all(Profile.load(path))


def test_targets_are_checked_against_the_report_numbers(written: Path) -> None:
    report = json.loads((written / "report.json").read_text())
    targets = {t["target"]: t for t in report["targets"]}
    vs_lara = report["table2_comparisons"]["mean"]["lara"]
    margin = next(t for name, t in targets.items() if name.startswith("mara − lara on the mean"))
    assert margin["met"] == (vs_lara["mean"] >= 0.085 and vs_lara["low"] > 0)
    rows = report["table2"]["rows"]  # the room exact demand gives LARA, stated next to the margin
    room = 100 * (rows["lara_oracle"]["mean"]["mean"] - rows["lara"]["mean"]["mean"])
    assert f"(lara_oracle, LARA told the true demand: {room:+.2f};" in margin["evidence"]
    room = 100 * (rows["llf_oracle"]["mean"]["mean"] - rows["lara"]["mean"]["mean"])
    assert f"llf_oracle, least-laxity planner told the true demand: {room:+.2f})" in margin["evidence"]
    on_id = report["table2_comparisons"]["id"]
    assert targets["mara − lara on id ≥ 8.0 points"]["met"] == (on_id["lara"]["mean"] >= 0.08)
    assert targets["mara above fifo on id"]["met"] == (on_id["fifo"]["mean"] > 0)
    for name in ("mara − best rule ≥ +1.5 points on the mean, CI excluding 0",
                 "mara − best rule ≥ 0 at every load of the sweep",
                 "gap to the Oracle bound on the mean ≤ 4.0 points"):
        assert name in targets
    rule = report["vs_best_rule"]["table2"][MEAN]
    assert targets["mara − best rule ≥ +1.5 points on the mean, CI excluding 0"]["met"] == \
        (rule["mean"] >= 0.015 and rule["low"] > 0)
    gap = -report["table2_comparisons"][MEAN]["oracle"]["mean"]
    assert targets["gap to the Oracle bound on the mean ≤ 4.0 points"]["met"] == (gap <= 0.04)
    stress = next(t for name, t in targets.items() if name.startswith("stress"))
    assert stress["met"] is False  # "mara" here is EDF, which scores 0 in the stress scenario
    assert "## Targets" in (written / "report.md").read_text()


def test_comparison_plot_accepts_a_mean_a_rounding_error_outside_its_interval(tmp_path: Path) -> None:
    """Resampled means of identical cells can differ from the full mean in the last bit."""
    cell = {"mean": 0.6500000000000001, "low": 0.65, "high": 0.65, "excludes_zero": True}
    report = {"table2_comparisons": {"mean": {"edf": cell}}, "table3_comparisons": {"edf": cell},
              "load_sweep_comparisons": {}, "reference": "mara"}
    assert plot_comparisons(report, tmp_path / "c.png").stat().st_size > 0


def test_the_evaluation_is_the_same_on_two_processes(smoke_bank: Path, untrained_fm, tmp_path: Path) -> None:
    """Cells handed to spawned workers come back in order with every figure bit for bit as
    one process computes them, an FM reader's included (journalled as they finish, in any order)."""
    fm = untrained_fm.export(tmp_path / "fm")
    available = builtin_methods(fm, {"optimistic_quantile": 0.15})
    methods = [available[m] for m in ("lara_fm_optimistic", "edf", "oracle")]
    for method in methods:  # raises where a method would keep the evaluation in this process
        pickle.dumps(method)

    def run(workers: int) -> str:
        records = evaluate(methods, ["id", "rl_ood"], [0.04], smoke_bank, EnvConfig(bank=str(smoke_bank)),
                           EvalConfig(roots=2, episodes_per_root=2, workers=workers), log_mlflow=False,
                           progress=False, out_dir=tmp_path / f"workers{workers}")
        return json.dumps([dataclasses.asdict(r) for r in records])

    alone = run(1)
    assert json.loads(alone)[0]["method"] == "lara_fm_optimistic" and json.loads(alone)[-1]["task_set"] == "rl_ood"
    assert run(2) == alone


def test_the_report_closes_with_what_its_figures_were_computed_from(smoke_bank: Path, untrained_fm,
                                                                     tmp_path: Path) -> None:
    """inputs.json beside results.json holds the digests of the bank, of FM's export and of a
    policy's weights; the report lists them, and flags an input that differs between evaluations."""
    fm = untrained_fm.export(tmp_path / "fm")
    env_cfg = EnvConfig(bank=str(smoke_bank), predictor=f"fm:{fm}")
    policy = export_policy(module_spec(env_cfg, MATConfig()).build(), tmp_path / "policy", env_cfg)
    rules = builtin_methods(fm, {})
    evaluate([learned("mara", policy, seed=0), rules["lara_fm"], rules["edf"]], ["id"], [0.04], smoke_bank, env_cfg,
             EvalConfig(roots=1, episodes_per_root=1, workers=1), out_dir=tmp_path / "main", log_mlflow=False,
             progress=False)
    inputs = load_inputs([tmp_path / "main" / "results.json"])
    assert inputs["bank"] == [bank_digest(smoke_bank)]
    assert inputs["predictors"] == {"fm": [predictor_digest(f"fm:{fm}")]}
    assert inputs["policies"] == {"mara (seed 0)": [policy_digest(policy)]}
    assert inputs["machine"] == [machine()]
    text = inputs_section(inputs)
    assert f"| bank | `{bank_digest(smoke_bank)}` |" in text and "differs" not in text

    other = tmp_path / "sweep"
    shutil.copytree(tmp_path / "main", other)
    written = json.loads((other / "inputs.json").read_text())
    (other / "inputs.json").write_text(json.dumps({**written, "bank": "0" * 16}))
    both = load_inputs([tmp_path / "main" / "results.json", other / "results.json"])
    assert both["bank"] == sorted([bank_digest(smoke_bank), "0" * 16]) and both["policies"] == inputs["policies"]
    assert "| bank | " in inputs_section(both) and "(differs between evaluations)" in inputs_section(both)


def test_a_rerun_evaluates_only_the_cells_whose_inputs_changed(smoke_bank: Path, untrained_fm, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With `reuse`, a cell keeps its record while its bank, predictor, policy, settings and the
    code are the same; another FM export re-evaluates FM's readers only; `reuse=False` all."""
    fm = untrained_fm.export(tmp_path / "fm")
    rules = builtin_methods(fm, {})
    methods = [rules["edf"], rules["lara_fm"]]
    evaluated: list[str] = []
    real = evaluate_module.evaluate_method
    monkeypatch.setattr(evaluate_module, "evaluate_method",
                        lambda method, *rest: evaluated.append(method.name) or real(method, *rest))

    def run(reuse: bool = True) -> str:
        evaluated.clear()
        records = evaluate(methods, ["id", "rl_ood"], [0.04], smoke_bank, EnvConfig(bank=str(smoke_bank)),
                           EvalConfig(roots=1, episodes_per_root=2, workers=1), out_dir=tmp_path / "eval",
                           log_mlflow=False, progress=False, reuse=reuse)
        return json.dumps([dataclasses.asdict(r) for r in records])

    first = run()
    assert sorted(evaluated) == ["edf", "edf", "lara_fm", "lara_fm"]
    assert run() == first and evaluated == []
    meta = json.loads((fm / "config.json").read_text())
    meta["config"]["inference"] = "numpy"  # the same network on the other backend: another export
    (fm / "config.json").write_text(json.dumps(meta))
    run()
    assert evaluated == ["lara_fm", "lara_fm"]
    run(reuse=False)
    assert sorted(evaluated) == ["edf", "edf", "lara_fm", "lara_fm"]


def test_a_stopped_evaluation_resumes_from_its_journal(smoke_bank: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cells finished before a crash are journalled and not evaluated again, with or without
    `reuse`; the resumed results equal an uninterrupted run's, and the journal is then gone."""
    rules = builtin_methods(None, {})
    methods = [rules["edf"], rules["fifo"], rules["lara"]]
    evaluated: list[str] = []
    real = evaluate_module.evaluate_method
    crash_at: list[int] = []

    def counting(method, *rest):
        if len(evaluated) in crash_at:
            raise RuntimeError("node lost")
        evaluated.append(method.name)
        return real(method, *rest)

    monkeypatch.setattr(evaluate_module, "evaluate_method", counting)

    def run(out: Path, reuse: bool) -> str:
        evaluated.clear()
        records = evaluate(methods, ["id", "rl_ood"], [0.04], smoke_bank, EnvConfig(bank=str(smoke_bank)),
                           EvalConfig(roots=1, episodes_per_root=2, workers=1), out_dir=out,
                           log_mlflow=False, progress=False, reuse=reuse)
        return json.dumps([dataclasses.asdict(r) for r in records])

    whole = run(tmp_path / "whole", reuse=False)
    crash_at.append(4)
    with pytest.raises(RuntimeError, match="node lost"):
        run(tmp_path / "stopped", reuse=False)
    journal = tmp_path / "stopped" / CELL_JOURNAL
    assert len(journal.read_text().splitlines()) == 4 and not (tmp_path / "stopped" / "results.json").exists()
    with journal.open("a") as f:
        f.write('{"key": "cut sho')  # the process was killed while writing a line
    crash_at.clear()
    assert run(tmp_path / "stopped", reuse=False) == whole
    assert evaluated == ["fifo", "lara"]  # the rl_ood cells after the first four
    assert not journal.exists()

    journal.write_text("not json\n{}\n")
    with pytest.raises(ConfigError, match="line 1"):
        run(tmp_path / "stopped", reuse=False)


def test_methods_come_in_the_registry_order_whatever_the_evaluations_order() -> None:
    """Evaluations made one after another (a rule added later, a variant trained later) still
    give the tables' rows in the registry's order: learned variants first."""
    names = ["edf", "lara_recall_optimistic", "my_policy", "mara_recall", "fifo", "mara"]
    records = [synthetic(m, "id", 0.5) for m in names]
    assert method_names(records) == ["mara", "mara_recall", "fifo", "edf", "lara_recall_optimistic", "my_policy"]
