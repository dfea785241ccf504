"""Live-mode subcommands of the `mara` CLI: `live` (one run) and `live-compare` (live against
the simulator, several streams and methods). They name methods as the evaluation does
(`mara_rl.methods`) and hand `mara_live` the allocator and env settings of each."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from mara_common.config import ConfigError
from mara_common.flags import comma_list
from mara_common.paths import PROFILE_DIR, normal_path
from mara_common.profile import Profile
from mara_common.tracking import ensure_experiment
from mara_env.env import EnvConfig
from mara_fm.build_bank import profile_bank
from mara_live.check import family_prediction, predicted_success, replay_live_run
from mara_live.config import LiveConfig
from mara_live.report import (
    LIVE_EXPERIMENT,
    TIMELINE_PNG,
    comparison_table,
    load_rows,
    log_live_run,
    paired_differences,
    plot_comparison,
    plot_curves,
    ranking_table,
    save_rows,
)
from mara_live.runner import CHECK, RESULT, LiveResult, run_live
from mara_live.streams import Stream, generate_stream, load_stream, save_stream
from mara_rl.methods import SPECS, VARIANTS, Method, builtin_methods, learned
from mara_rl.pipeline import trained_policies
from mara_rl.provenance import digest, method_inputs
from mara_rl.stats import hierarchical_bootstrap
from mara_rl.submit import check_cluster, submit_command
from mara_rl.timeline import Timeline
from mara_rl.timeline import plot as plot_timeline

LIVE_MD, LIVE_PNG, LIVE_JSON = "live.md", "live.png", "live.json"
# LiveConfig fields that say which rows a comparison makes, not what a row depends on.
BATCH_FIELDS = ("streams", "stream_seed", "methods", "show_every")


def live_method(profile: Profile, env_cfg: EnvConfig, name: str, policy: str | None = None,
                fm: str | None = None) -> Method:
    """A method of the evaluation by name; a learned one reads `policy` or the profile's seed-0 run,
    one that reads FM the predictor `fm` or the profile's."""
    if name in SPECS:
        fm_path = Path(fm) if fm else profile.paths.predictor
        methods = builtin_methods(normal_path(fm_path) if fm_path.exists() else None, env_cfg.view_options)
        if name not in methods:
            raise ConfigError(f"method {name!r} needs {' and '.join(SPECS[name].needs())}")
        return methods[name]
    return learned(name, policy_path(profile, name, policy))


def policy_path(profile: Profile, name: str, policy: str | None) -> str:
    """The policy folder of learned method `name`: `policy`, or the profile's seed-0 export."""
    if policy:
        return normal_path(policy)
    if name not in {v.name for v in VARIANTS}:
        raise ConfigError(f"unknown method {name!r}; known: {sorted(SPECS)} and the learned {[v.name for v in VARIANTS]}")
    found = trained_policies(profile).get((name, 0))
    if found is None or not found.exists():
        raise FileNotFoundError(f"no exported policy for {name!r} (train it: make train-scheduler), or pass --policy")
    return normal_path(found.parent)


def run_folder(root: Path, method: Method, stream: Stream) -> Path:
    """A live run's default folder: `<method>-stream<seed>` (`file` for a stream read from a file)."""
    return root / f"{method.name}-stream{stream.meta.get('seed', 'file')}"


def live_env_config(profile: Profile, bank: Path, cfg: LiveConfig) -> EnvConfig:
    return profile.section(EnvConfig, "env", bank=str(bank), task_set=cfg.task_set, split=cfg.split,
                           horizon=cfg.horizon, arrival_prob=cfg.arrival_prob)


def live_run(method: Method, env_cfg: EnvConfig, stream: Stream, out: Path, cfg: LiveConfig,
             tags: dict[str, Any], progress: bool = True) -> tuple[LiveResult, dict]:
    """A live run, its replay in the simulator, its plots and its MLflow run."""
    save_stream(stream, out / "stream.json")
    method_cfg = method.env_config(env_cfg)
    result = run_live(method.name, method.make, method_cfg, stream, out, cfg, progress=progress)
    check = replay_live_run(method.make, method_cfg, stream, out)
    (out / CHECK).write_text(json.dumps(check))
    plot_curves(out, stream, result)
    served = result.served
    plot_timeline({f"{method.name} (live)": Timeline(served, np.zeros_like(served, bool), np.asarray(result.succeeded),
                                                     np.ones(served.shape[1]))}, out / TIMELINE_PNG)
    log_live_run(out, method.name, stream, result, check, tags)
    return result, check


def job_table(stream: Stream, result: LiveResult) -> str:
    """Per job kind: jobs, successes, and batches trained."""
    kinds = sorted({j.kind for j in stream.jobs})
    rows = ["| job kind | jobs | succeeded | batches trained |", "|---|---|---|---|"]
    for kind in kinds:
        mine = [i for i, j in enumerate(stream.jobs) if j.kind == kind]
        rows.append(f"| {kind} | {len(mine)} | {sum(result.succeeded[i] for i in mine)} | "
                    f"{sum(result.stats['known_points'][i] for i in mine)} |")
    return "\n".join(rows)


def planned_live(args: argparse.Namespace) -> tuple[LiveConfig, EnvConfig, Stream, Method, Path]:
    """(settings, env settings, stream, method, run folder) of a `live` command, every input checked."""
    profile: Profile = args.profile
    cfg = profile.section(LiveConfig, "live", kill_at=args.kill_at, horizon=args.horizon,
                          stream_seed=args.stream_seed)
    env_cfg = live_env_config(profile, profile_bank(profile, args.bank), cfg)
    stream = load_stream(args.stream) if args.stream else generate_stream(env_cfg, cfg.stream_seed)
    method = live_method(profile, env_cfg, args.method, args.policy, args.fm)
    return cfg, env_cfg, stream, method, Path(args.out) if args.out else run_folder(profile.paths.report / "live",
                                                                                    method, stream)


def cmd_live(args: argparse.Namespace) -> None:
    cfg, env_cfg, stream, method, out = planned_live(args)
    result, check = live_run(method, env_cfg, stream, out, cfg, {"profile": args.profile.name, "kind": "live"})
    print(f"{method.name}: {sum(result.succeeded)} of {len(result.succeeded)} jobs succeeded "
          f"({100 * result.success_rate:.1f}%), {result.stats['faults']} node fault(s), "
          f"{result.stats['replayed_batches']} batches retrained after them; scheduler overhead "
          f"{np.median(result.overhead_ms):.2f} ms per tick (median; p95 {np.percentile(result.overhead_ms, 95):.2f})")
    print(f"simulator replay on the live curves: {check['matching_decisions']} of {check['decisions']} decisions "
          f"and {'every' if check['successes_match'] else 'NOT every'} success reproduced")
    print(job_table(stream, result))
    print(f"run folder: {out}")


def cmd_submit_live(args: argparse.Namespace) -> None:
    """`mara live` as a Ray job on `RAY_ADDRESS`, its inputs checked and its paths made absolute here."""
    profile: Profile = args.profile
    cfg, env_cfg, stream, method, out = planned_live(args)
    address = check_cluster(args.address)
    ensure_experiment(LIVE_EXPERIMENT, args.mlflow_uri)
    named = profile.path.parent.resolve() == PROFILE_DIR.resolve()
    argv = ["--profile", profile.name if named else normal_path(profile.path), "--bank", normal_path(env_cfg.bank),
            "--method", method.name, "--out", normal_path(out), "--kill-at", str(cfg.kill_at),
            "--horizon", str(cfg.horizon)]
    argv += ["--stream", normal_path(args.stream)] if args.stream else ["--stream-seed", str(stream.meta["seed"])]
    fm = Path(args.fm) if args.fm else profile.paths.predictor
    argv += ["--fm", normal_path(fm)] if fm.exists() else []
    argv += ["--policy", policy_path(profile, args.method, args.policy)] if args.method not in SPECS else []
    job_id, status = submit_command("live", argv, address=address, wait=args.wait, timeout_s=args.timeout,
                                    mlflow_uri=args.mlflow_uri)
    print(f"job {job_id}: {status}")
    if args.wait and status != "SUCCEEDED":
        sys.exit(1)


def cmd_live_compare(args: argparse.Namespace) -> None:
    """Each method live on each stream beside the simulator's prediction. A row is saved to
    `<results>/live.json` as soon as it is made, with a digest of what it depends on
    (`row_inputs`), so a batch longer than one machine's life resumes from its rows on a rerun;
    a finished run folder is read back only if replaying it reproduces its own check."""
    profile: Profile = args.profile
    cfg = replace(profile.section(LiveConfig, "live", streams=args.streams, kill_at=args.kill_at,
                                  stream_seed=args.stream_seed), show_every=0)
    env_cfg = live_env_config(profile, profile_bank(profile, args.bank), cfg)
    names = comma_list(args.methods, "--methods") or list(cfg.methods)
    methods = [live_method(profile, env_cfg, name) for name in names]
    inputs = {name: row_inputs(method, env_cfg, cfg) for name, method in zip(names, methods, strict=True)}
    out = Path(args.out) if args.out else profile.paths.report / "live"
    results = Path(args.results) if args.results else profile.paths.results
    results.mkdir(parents=True, exist_ok=True)
    plan = [(seed, method) for seed in range(cfg.stream_seed, cfg.stream_seed + cfg.streams) for method in methods]
    keys = [(seed, m.name) for seed, m in plan]
    done = {} if args.fresh else kept_rows(results / LIVE_JSON, {key: inputs[key[1]] for key in keys})
    streams: dict[int, Stream] = {}
    for seed, method in plan:
        if (seed, method.name) in done:
            continue
        stream = streams.setdefault(seed, generate_stream(env_cfg, seed))
        run_dir = run_folder(out, method, stream)
        method_cfg = method.env_config(env_cfg)
        if (run_dir / CHECK).exists():  # a finished run is read back, not run again
            if replay_live_run(method.make, method_cfg, stream, run_dir) != json.loads((run_dir / CHECK).read_text()):
                raise ConfigError(f"{run_dir}: replaying this finished run with today's {method.name} does not give "
                                  "its recorded check (another policy, predictor or bank?); move it or pass --out")
        else:
            live_run(method, env_cfg, stream, run_dir, cfg, {"profile": profile.name, "kind": "live-compare"},
                     progress=False)
        finished, check = (json.loads((run_dir / name).read_text()) for name in (RESULT, CHECK))
        stats = finished["stats"]
        done[seed, method.name] = {
            "stream": seed, "jobs": len(stream.jobs), "method": method.name, "live": finished["success_rate"],
            "simulated": predicted_success(method.make, method_cfg, stream),
            "simulated_family": family_prediction(method.make, method_cfg, stream, cfg.family_draws, seed),
            "replay_exact": check["successes_match"] and check["matching_decisions"] == check["decisions"],
            "faults": stats["faults"], "overhead_ms": finished["overhead_ms"]["median"],
            "restore_ms": 1000 * stats["restore_s"] / max(stats["restores"], 1),
            "batch_ms": 1000 * stats["train_s"] / max(stats["batches"], 1), "inputs": inputs[method.name]}
        save_rows([done[key] for key in keys if key in done], results / LIVE_JSON)
        print(f"stream {seed}, {method.name}: {len(done)} of {len(plan)} rows", flush=True)
    rows = [done[key] for key in keys]  # every row is in live.json already, saved as it was made
    table = comparison_table(rows, stream_intervals(rows))
    ranking = ranking_table(rows, ranking_intervals(rows)) if len(methods) > 1 else ""
    (results / LIVE_MD).write_text(
        f"# Live against the simulator ({profile.name} profile)\n\n"
        f"Generated by `mara live-compare`: {cfg.streams} streams (seeds {cfg.stream_seed}..), drawn from the "
        f"bank's {cfg.task_set} {cfg.split} curves at p = {cfg.arrival_prob} over {cfg.horizon} ticks; every job a "
        f"fresh run of its stand-in curve's family, trained on {env_cfg.n_nodes} Ray node actors"
        f"{f', one of which is killed at tick {cfg.kill_at} of every run' if cfg.kill_at >= 0 else ''}. "
        "`sim (stand-ins)`: the same streams replayed on the stand-in curves, whose own losses set each "
        f"job's threshold; `sim (family)`: replayed on other recorded runs of each job's family, {cfg.family_draws} "
        "draws averaged (a live job is such a run). `replay exact`: the simulator replaying each live run on its "
        "own curves reproduced every decision and success. Differences in points, with 95% bootstrap "
        f"intervals over streams.\n\n{table}\n\n"
        + (f"{methods[0].name} against each other method (points; streams resampled whole, the same "
           f"streams for both columns):\n\n{ranking}\n\n" if ranking else "")
        + f"![live vs simulator]({LIVE_PNG})\n")
    plot_comparison(rows, results / LIVE_PNG)
    print(table + (f"\n\n{ranking}" if ranking else ""))


def row_inputs(method: Method, env_cfg: EnvConfig, cfg: LiveConfig) -> str:
    """A digest of what a live-compare row depends on besides its stream's seed: the method's
    inputs (`method_inputs`: its env settings, the content of its bank, predictor and weights)
    and every live setting but those that choose the batch's rows (`BATCH_FIELDS`)."""
    return digest({**method_inputs(method, env_cfg),
                   "live": {k: v for k, v in asdict(cfg).items() if k not in BATCH_FIELDS}})


def kept_rows(path: Path, planned: dict[tuple[int, str], str]) -> dict[tuple[int, str], dict[str, Any]]:
    """The rows of `path` (none if it does not exist) that this batch keeps: each must be one of
    `planned` ((stream, method) → inputs digest) and carry the same digest; anything else in the
    file is refused rather than overwritten."""
    if not path.exists():
        return {}
    kept = {(r["stream"], r["method"]): r for r in load_rows(path)}
    foreign = sorted(set(kept) - set(planned))
    if foreign:
        raise ConfigError(f"{path} holds rows of another batch (stream, method: {foreign[:3]}"
                          f"{' ...' if len(foreign) > 3 else ''}); pass another --results, or --fresh to start anew")
    for key, row in kept.items():
        if row.get("inputs") != planned[key]:
            raise ConfigError(f"{path}: the row of stream {key[0]}, {key[1]} was made with other inputs "
                              f"({row.get('inputs') or 'not recorded'}; now {planned[key]}: another bank, "
                              "predictor, policy or setting); pass another --results, or --fresh to start anew")
    return kept


def stream_intervals(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per method and prediction, the bootstrap interval of live − predicted success over streams
    (streams resampled whole: one stream's jobs share its arrivals)."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == method]
        out[method] = {}
        for key in ("simulated", "simulated_family"):
            diff = hierarchical_bootstrap(np.array([[r["live"] - r[key] for r in mine]]))
            out[method][key] = (diff.low, diff.high)
    return out


def ranking_intervals(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per other method, the bootstrap interval over streams of the first method's success minus
    its own, live and in the family prediction (`ranking_table`)."""
    first, *others = dict.fromkeys(r["method"] for r in rows)
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for other in others:
        out[other] = {}
        for key in ("live", "simulated_family"):
            diff = hierarchical_bootstrap(paired_differences(rows, first, other, key)[None])
            out[other][key] = (diff.low, diff.high)
    return out


def add_live_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="mara", help="an evaluation method or learned variant (default mara)")
    p.add_argument("--policy", help="an exported policy folder for a learned method")
    p.add_argument("--stream", help="a job stream file (default: one generated with the profile's workload)")
    p.add_argument("--stream-seed", type=int, help="seed of the generated stream (default [live] stream_seed)")
    p.add_argument("--horizon", type=int, help="ticks of a generated stream (default [live] horizon)")
    p.add_argument("--kill-at", type=int, help="kill one node actor at this tick, to show recovery")
    p.add_argument("--bank")
    p.add_argument("--fm", help="the exported FM predictor of methods that read FM (default the profile's)")
    p.add_argument("--out", help="run folder (default reports/<profile>/live/<method>-stream<seed>); "
                   "an interrupted run there resumes")


def register(subparsers: Any, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser("live", parents=[common], help="schedule real training jobs on Ray node actors")
    add_live_arguments(p)
    p.set_defaults(func=cmd_live, outputs=("out",))

    p = subparsers.add_parser("submit-live", parents=[common],
                              help="submit a live run to a Ray cluster as a job (RAY_ADDRESS: its dashboard)")
    add_live_arguments(p)
    p.add_argument("--address", help="Ray dashboard address (default: $RAY_ADDRESS)")
    p.add_argument("--mlflow-uri", help="tracking URI for the job (default: this side's)")
    p.add_argument("--wait", action="store_true", help="poll until the job ends, echoing its logs")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait with --wait")
    p.set_defaults(func=cmd_submit_live, outputs=("out",))

    p = subparsers.add_parser("live-compare", parents=[common],
                              help="methods live on Ray against the simulator's prediction, several streams")
    p.add_argument("--methods", help="comma-separated (default [live] methods)")
    p.add_argument("--streams", type=int, help="generated streams (default [live] streams)")
    p.add_argument("--stream-seed", type=int, help="seed of the first stream (default [live] stream_seed); "
                   "another batch of streams is a replication, to be written beside the first with --results")
    p.add_argument("--kill-at", type=int, help="kill one node actor at this tick of every run")
    p.add_argument("--bank")
    p.add_argument("--out", help="folder of the runs (default reports/<profile>/live)")
    p.add_argument("--results", help="folder of the table, its plot and its per-stream rows, live.json (default results/<profile>)")
    p.add_argument("--fresh", action="store_true", help="start the batch anew: rows already in the results folder's "
                   "live.json are replaced, not kept")
    p.set_defaults(func=cmd_live_compare, outputs=("out", "results"))
