"""`mara reproduce` and `mara report`: the whole protocol of docs/design.md §8.

`reproduce` runs bank → FM predictor (+ its evaluation) → schedulers (each
variant of `[evaluation] variants`, per seed of `scheduler_seeds`) →
evaluation of every method (3 task sets at the main load, the stress
scenario, the load sweep) → report. Each stage is skipped when its output
file exists and is newer than the files it was made from (as `make` does),
so an interrupted run continues where it stopped, and a retrained scheduler
is evaluated again; a scheduler whose run folder holds a checkpoint but no
exported policy resumes from it. A finished scheduler run whose settings
differ from the profile's and the code's (say, a changed workload default)
stops the pipeline with the settings named, rather than being reused.
Delete a stage's output to redo it (and the stages after it).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from mara_common.config import ConfigError
from mara_common.profile import Profile
from mara_env.env import EnvConfig
from mara_fm.build_bank import BankConfig, check_built_with, ensure_bank, ensure_history_bank
from mara_fm.eval_predictor import evaluated_predictors, run_eval
from mara_fm.fm_model import PredictorConfig
from mara_fm.predictors.recall import MEMORY_FILE, has_memory
from mara_fm.train_predictor import train_predictor
from mara_rl.evaluate import EvalConfig, evaluate, frozen_episodes
from mara_rl.methods import (
    BUILTIN,
    VARIANTS,
    Method,
    Variant,
    builtin_methods,
    learned,
    parse_policies,
)
from mara_rl.policy import POLICY_SPEC
from mara_rl.provenance import load_inputs
from mara_rl.records import load_records
from mara_rl.report import REPORT_JSON, ReportConfig, write_report
from mara_rl.run_state import load_state, policy_dir, run_inputs, settings_changed
from mara_rl.scheduler_config import SchedulerConfig, default_out, scheduler_config, training_env
from mara_rl.timeline import TIMELINE_PNG, record
from mara_rl.timeline import plot as plot_timelines
from mara_rl.train_scheduler import train


@dataclass(frozen=True)
class PipelineConfig:
    report: ReportConfig = field(default_factory=ReportConfig)  # task sets and main load too
    stress_task_set: str = "id"
    # Figure 4 on ID only: the sweep costs 3 more loads × every method, and the main
    # evaluation already covers the OOD sets.
    sweep_loads: tuple[float, ...] = (0.04, 0.05, 0.06, 0.07)
    sweep_task_sets: tuple[str, ...] = ("id",)


def pipeline_config(profile: Profile) -> PipelineConfig:
    """The protocol's settings, with the report's targets from the profile's [report]."""
    return PipelineConfig(report=profile.section(ReportConfig, "report"))


@dataclass
class Stage:
    name: str
    output: Path  # the stage is done when this file exists and is newer than every input
    run: Callable[[], Any]
    inputs: tuple[Path, ...] = ()
    check: Callable[[], None] | None = None  # raises if an existing output must not be reused
    covers: Callable[[], bool] | None = None  # False if an existing output lacks what the stage now makes

    def done(self) -> bool:
        if not self.output.exists():
            return False
        if self.check is not None:
            self.check()
        if self.covers is not None and not self.covers():
            return False
        made = self.output.stat().st_mtime
        return all(not p.exists() or p.stat().st_mtime <= made for p in self.inputs)


def run_stages(stages: list[Stage], progress: bool = True) -> None:
    """One progress bar over all stages, one line per stage as it is skipped or finished."""
    bar = tqdm(stages, desc="reproduce", unit="stage", disable=not progress)
    for stage in bar:
        bar.set_postfix_str(stage.name)
        if stage.done():
            tqdm.write(f"[{stage.name}] skipped: {stage.output} is up to date")
            continue
        start = time.perf_counter()
        stage.run()
        tqdm.write(f"[{stage.name}] done in {time.perf_counter() - start:.0f}s: {stage.output}")


def variant_config(profile: Profile, variant: Variant, seed: int) -> SchedulerConfig:
    """A learned variant's settings: the profile's `[scheduler]` with its overrides — the same
    config `mara train-scheduler` builds from the same flags, so either reuses the other's run."""
    return scheduler_config(profile, seed=seed, **variant.settings)


def scheduler_stage(profile: Profile, variant: Variant, seed: int) -> Stage:
    cfg = variant_config(profile, variant, seed)
    out = default_out(profile, cfg)
    bank = profile.paths.bank

    def run() -> None:
        train(cfg, training_env(cfg, profile, bank), out, run_name=out.name,
              tags={"profile": profile.name, "variant": variant.name})

    def check() -> None:
        env_cfg = training_env(cfg, profile, bank)
        changed = settings_changed(load_state(out), cfg, env_cfg, run_inputs(env_cfg))
        if changed:
            raise ConfigError(f"{out} was trained with other settings or inputs than this code and profile "
                              f"give ({', '.join(changed)}): move it aside (or delete it) to retrain it")

    def covers() -> bool:  # trained as far as the profile now asks (a resume continues it)
        return load_state(out).get("iteration", -1) >= cfg.iterations

    # Its inputs are compared by content (`check`), not by time: a bank rebuilt identically
    # leaves the run valid.
    return Stage(f"scheduler {variant.name} seed {seed}", policy_dir(out) / POLICY_SPEC, run, (), check, covers)


def trained_policies(profile: Profile) -> dict[tuple[str, int], Path]:
    """(variant, seed) → the policy.json its training run exports, for every variant and seed."""
    return {(v.name, seed): scheduler_stage(profile, v, seed).output for v, seed in trained_variants(profile)}


def trained_variants(profile: Profile) -> list[tuple[Variant, int]]:
    """(variant, seed) of every run the profile's [evaluation] asks for, seed by seed."""
    cfg = profile.section(EvalConfig, "evaluation")
    return [(v, seed) for seed in cfg.scheduler_seeds for v in VARIANTS if v.name in cfg.variants]


def profile_methods(profile: Profile) -> dict[str, Method]:
    """The registry's methods this profile can run: on its FM predictor, and on its history
    bank when it has a `[history_bank]` (built here if missing)."""
    history = ensure_history_bank(profile)
    return builtin_methods(profile.paths.predictor.resolve(), profile.section(EnvConfig, "env").view_options,
                           history.resolve() if history else None)


def evaluation_stages(profile: Profile, cfg: PipelineConfig,
                      policies: dict[tuple[str, int], Path], reuse: bool = True) -> list[Stage]:
    """Main table, stress scenario and load sweep: every method on the same frozen episodes.
    With `reuse`, a stage run again evaluates only the cells whose inputs or code changed
    (`mara_rl.provenance.cell_key`): a retrained seed, an added method."""
    paths = profile.paths
    env_cfg = profile.section(EnvConfig, "env")
    eval_cfg = profile.section(EvalConfig, "evaluation")
    available = profile_methods(profile)
    classic = [available[s.name] for s in BUILTIN if s.name in available]

    def run(name: str, task_sets: list[str], loads: list[float], scenario: str) -> Stage:
        out = paths.evaluation / name

        def go() -> None:
            methods = [learned(v, policy.parent, seed) for (v, seed), policy in policies.items()]
            evaluate(methods + classic, task_sets, loads, paths.bank, env_cfg, eval_cfg, scenario=scenario,
                     out_dir=out, tags={"profile": profile.name, "evaluation": name}, reuse=reuse)

        def covers() -> bool:  # a method added to the registry since (or a new seed) reruns the stage
            recorded = {(r.method, r.seed) for r in load_records([out / "results.json"])}
            return set(policies) | {(m.name, None) for m in classic} <= recorded

        return Stage(f"evaluate {name}", out / "results.json", go,
                     (paths.bank, paths.predictor / "config.json", *policies.values()), covers=covers)

    main_load = cfg.report.main_load
    sweep = [p for p in cfg.sweep_loads if p != main_load]  # the main load comes from "main"
    return [run("main", list(cfg.report.task_sets), [main_load], "default"),
            run("stress", [cfg.stress_task_set], [main_load], "stress"),
            run("sweep", list(cfg.sweep_task_sets), sweep, "default")]


def timeline_stage(profile: Profile, cfg: PipelineConfig, policies: dict[tuple[str, int], Path]) -> Stage:
    """The per-node timeline of every method (learned ones: their first seed) on the first
    frozen test episode of the first task set at the main load."""
    paths, env_cfg = profile.paths, profile.section(EnvConfig, "env")
    out = paths.report / TIMELINE_PNG

    def run() -> None:
        eval_cfg = profile.section(EvalConfig, "evaluation")
        task_set, load = cfg.report.task_sets[0], cfg.report.main_load
        episode = frozen_episodes(paths.bank, task_set, eval_cfg.split, load, 0, eval_cfg.episodes_per_root,
                                  env_cfg.horizon, env_cfg.workload)[0]
        first = min(eval_cfg.scheduler_seeds)
        methods = [learned(v, policy.parent, seed) for (v, seed), policy in policies.items() if seed == first]
        methods += [m for m in profile_methods(profile).values() if m.make is not None]
        cfg_here = dataclasses.replace(env_cfg, bank=str(paths.bank), task_set=task_set, split=eval_cfg.split,
                                       arrival_prob=load, arrival_prob_max=None)
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_timelines({m.name: record(m, cfg_here, episode) for m in methods}, out)

    return Stage("timeline", out, run, (paths.bank, paths.predictor / "config.json", *policies.values()))


def bank_stage(profile: Profile) -> Stage:
    """The profile's curve bank: an existing one built with other `[bank]` settings stops the
    pipeline (`check_built_with`) instead of feeding every later stage its old curves."""
    cfg, path = profile.section(BankConfig, "bank"), profile.paths.bank
    return Stage("bank", path, lambda: ensure_bank(cfg, path), check=lambda: check_built_with(cfg, path))


def predictor_eval_stage(profile: Profile) -> Stage:
    """FM, recall and WLS on the test curves, and the history predictor where the profile has
    a `[history_bank]`: an evaluation made before it scored all of them is made again."""
    paths = profile.paths
    history = (paths.history_bank,) if profile.values("history_bank") else ()

    def covers() -> bool:
        needed = {*(["recall"] if has_memory(paths.predictor) else []), *(["history"] if history else [])}
        return not needed or needed <= evaluated_predictors(paths.predictor_eval)

    return Stage("predictor evaluation", paths.predictor_eval,
                 lambda: run_eval(paths.predictor, paths.bank, paths.predictor_report,
                                  history_bank=ensure_history_bank(profile)),
                 (paths.bank, paths.predictor / "config.json", paths.predictor / MEMORY_FILE, *history), covers=covers)


def make_report(profile: Profile, eval_dir: Path | None = None, out_dir: Path | None = None,
                predictor_eval: Path | None = None, cfg: ReportConfig | None = None,
                log_mlflow: bool = True, publish: bool = True) -> Path:
    """The report from every `results.json` under `eval_dir`; returns report.md's path.

    With `publish`, the tables also go to `results/<profile>/` and the README's results block.
    """
    paths = profile.paths
    eval_dir = eval_dir or paths.evaluation
    results = sorted(eval_dir.rglob("results.json"))
    if not results:
        raise FileNotFoundError(f"no results.json under {eval_dir} (run `mara reproduce` or "
                                "`mara evaluate --out` there first)")
    out_dir = out_dir or paths.report
    write_report(load_records(results), out_dir, profile.name, cfg or profile.section(ReportConfig, "report"),
                 predictor_eval or paths.predictor_eval, log_mlflow,
                 publish_to=paths.results if publish else None, inputs=load_inputs(results))
    return out_dir / "report.md"


def reproduce(profile: Profile, cfg: PipelineConfig | None = None, progress: bool = True) -> Path:
    """Every stage of `profile` in order, skipping those already done."""
    paths = profile.paths
    cfg = cfg or pipeline_config(profile)
    # The predictor trains on the wide bank too when the profile says so (built on first use).
    banks = (paths.bank, paths.wide_bank) if profile.section(PredictorConfig, "predictor").wide_families \
        else (paths.bank,)
    stages = [
        bank_stage(profile),
        # The memory is written last: an export from before the recall predictor is completed.
        Stage("predictor", paths.predictor / MEMORY_FILE,
              lambda: train_predictor(profile, paths.bank, paths.predictor_run), banks),
        predictor_eval_stage(profile),
    ]
    stages += [scheduler_stage(profile, v, seed) for v, seed in trained_variants(profile)]
    evaluations = evaluation_stages(profile, cfg, trained_policies(profile))
    stages += evaluations
    stages.append(timeline_stage(profile, cfg, trained_policies(profile)))
    stages.append(Stage("report", paths.report / REPORT_JSON, lambda: make_report(profile, cfg=cfg.report),
                        (paths.predictor_eval, stages[-1].output, *(e.output for e in evaluations))))
    run_stages(stages, progress)
    return paths.report / "report.md"


def evaluate_all(profile: Profile, cfg: PipelineConfig | None = None,
                 extra: dict[tuple[str, int | None], Path] | None = None, fresh: bool = False) -> None:
    """The evaluation stages of `reproduce` (main, stress, sweep), always rerun, for the
    trained variants of every seed (which must exist) plus `extra` policies by (name,
    seed); an extra policy without a seed counts as seed 0, like a one-seed pipeline's.
    A cell evaluated before with the same inputs and code keeps its record unless `fresh`."""
    cfg = cfg or pipeline_config(profile)
    policies = trained_policies(profile)
    missing = [f"{name} (seed {seed}): {path}" for (name, seed), path in policies.items() if not path.exists()]
    if missing:
        raise FileNotFoundError("no trained policy for " + "; ".join(missing)
                                + " — train it (`make train-scheduler`, see README) or run `make reproduce`")
    for (name, seed), path in (extra or {}).items():
        key = (name, 0 if seed is None else seed)
        if key in policies:
            raise ConfigError(f"--policies {name}{'' if seed is None else f'@{seed}'}: the pipeline already "
                              f"evaluates {name} seed {key[1]} ({policies[key].parent}); name another seed")
        policies[key] = Path(path) / POLICY_SPEC
    for stage in evaluation_stages(profile, cfg, policies, reuse=not fresh):
        stage.run()


def cmd_evaluate_all(args: argparse.Namespace) -> None:
    evaluate_all(args.profile, extra=parse_policies(args.policies), fresh=args.fresh)
    print(f"results under {args.profile.paths.evaluation} (then `mara report --profile {args.profile.name}`)")


def cmd_reproduce(args: argparse.Namespace) -> None:
    print(f"report: {reproduce(args.profile)}")


def cmd_report(args: argparse.Namespace) -> None:
    path = make_report(args.profile, Path(args.eval_dir) if args.eval_dir else None,
                       Path(args.out) if args.out else None,
                       Path(args.predictor_eval) if args.predictor_eval else None,
                       args.profile.section(ReportConfig, "report", reference=args.reference),
                       log_mlflow=not args.no_mlflow, publish=not args.no_publish)
    print(f"report: {path}")


def register(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("reproduce", parents=[common], help="every stage, bank to report (resumable)")
    p.set_defaults(func=cmd_reproduce)

    p = subparsers.add_parser("evaluate-all", parents=[common],
                              help="every method and trained variant: main table, stress scenario, load "
                              "sweep (the evaluation stages of reproduce)")
    p.add_argument("--policies", help="extra learned methods as NAME[@SEED]=POLICY_DIR,...")
    p.add_argument("--fresh", action="store_true",
                   help="evaluate every cell again, also those whose inputs and code are unchanged")
    p.set_defaults(func=cmd_evaluate_all)

    p = subparsers.add_parser("report", parents=[common], help="Tables 1-4, load sweep and paired CIs from results")
    p.add_argument("--eval-dir", help="folder searched for results.json (default reports/<profile>/eval)")
    p.add_argument("--out", help="report folder (default reports/<profile>)")
    p.add_argument("--predictor-eval", help="predictor_eval.json for Table 1 "
                   "(default reports/predictor/<profile>/predictor_eval.json, if present)")
    p.add_argument("--reference", default="mara", help="method every other is compared against")
    p.add_argument("--no-mlflow", action="store_true")
    p.add_argument("--no-publish", action="store_true",
                   help="leave results/ and the README's results block as they are")
    p.set_defaults(func=cmd_report, outputs=("out",))
