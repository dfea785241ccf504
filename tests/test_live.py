"""Live mode on a real local Ray: real jobs on node actors, a killed node, a resumed run, and
the simulator replaying what happened."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest

from mara_common.config import ConfigError
from mara_common.threads import torch_threads
from mara_env.cluster import ClusterConfig
from mara_fm.bank import load_bank
from mara_fm.families import FAMILIES
from mara_live.check import family_prediction, predicted_success, replay_live_run
from mara_live.config import LiveConfig
from mara_live.curves import GrowingCurves
from mara_live.env import Assignment, LiveEnv
from mara_live.log import LOG, Recorder, TickLog
from mara_live.placement import Placement
from mara_live.report import LIVE_EXPERIMENT, ranking_table, sign_test_p
from mara_live.runner import BANK, run_live
from mara_live.streams import JobSpec, Stream, generate_stream, load_stream, save_stream
from mara_rl.cli import main
from mara_rl.live_commands import live_env_config, live_run, ranking_intervals, run_folder
from mara_rl.methods import builtin_methods
from tests.conftest import SMOKE_PROFILE

pytestmark = pytest.mark.integration
CFG = replace(SMOKE_PROFILE.section(LiveConfig, "live"), kill_at=30, kill_node=2)


@pytest.fixture(scope="module")
def setting(smoke_bank: Path):
    env_cfg = live_env_config(SMOKE_PROFILE, smoke_bank, CFG)
    lara = builtin_methods(None, {})["lara"]
    return lara.env_config(env_cfg), generate_stream(env_cfg, CFG.stream_seed), lara


@pytest.fixture(scope="module")
def finished(setting, ray_local, tmp_path_factory):
    """One live run as `mara live` makes it (run, replay check, plots, MLflow run in a private
    store), in the folder `live-compare` reads its runs from."""
    env_cfg, stream, lara = setting
    root = tmp_path_factory.mktemp("live")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
        run_dir = run_folder(root / "runs", lara, stream)
        result, _ = live_run(lara, env_cfg, stream, run_dir, CFG, {"profile": "smoke", "kind": "live"},
                             progress=False)
    return run_dir, result


def test_a_live_run_accounts_for_every_job_through_a_node_fault(setting, finished) -> None:
    env_cfg, stream, _ = setting
    run_dir, result = finished
    stats = result.stats
    assert len(stream.jobs) >= 8 and stats["faults"] == 1
    assert sum(result.succeeded) == stats["episode_successes"] > 0
    assert stats["episode_successes"] + stats["expirations"] + stats["rejections"] == len(stream.jobs)
    assert stats["restores"] > 0 and stats["moves"] < stats["restores"]  # jobs mostly resume where they paused
    # Every job's live curve is the curve its run gives uninterrupted: restores, the killed node
    # and the retrained batches after it left no seam.
    # The log holds each loss once, at the tick that trained it: its losses, job by job, are the curve.
    logged: dict[int, list[float]] = {}
    for line in (run_dir / LOG).read_text().splitlines():
        for k, losses in json.loads(line)["losses"].items():
            logged.setdefault(int(k), []).extend(losses)
    assert {k: len(v) for k, v in logged.items()} == {k: n for k, n in enumerate(stats["known_points"]) if n}
    # (Node actors train on one thread, as the bank's builder does: a thread count changes float sums.)
    bank = load_bank(run_dir / BANK)
    with torch_threads(1):
        for job, losses, n in zip(stream.jobs, bank["losses"], stats["known_points"], strict=True):
            if n:
                np.testing.assert_array_equal(losses[:n], FAMILIES[job.kind].run(job.seed, n)["losses"])


def test_the_simulator_replays_a_live_run_exactly(setting, finished) -> None:
    env_cfg, stream, lara = setting
    run_dir, result = finished
    check = replay_live_run(lara.make, env_cfg, stream, run_dir)
    assert check["matching_decisions"] == check["decisions"] == stream.horizon
    assert check["successes_match"] and check["replayed_success_rate"] == result.success_rate
    # The simulator's predictions for the stream: on its stand-ins, and on other runs of each family.
    assert 0.0 <= predicted_success(lara.make, env_cfg, stream) <= 1.0
    family = family_prediction(lara.make, env_cfg, stream, draws=2, seed=5)
    assert 0.0 <= family <= 1.0 and family == family_prediction(lara.make, env_cfg, stream, draws=2, seed=5)


def test_a_stopped_run_resumes_from_its_log_and_checkpoints(setting, finished, tmp_path) -> None:
    env_cfg, stream, lara = setting
    run_dir, result = finished
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed_dir)
    lines = (resumed_dir / LOG).read_text().splitlines()
    (resumed_dir / LOG).write_text("\n".join(lines[:60]) + "\n")  # stopped after tick 59; checkpoints are later
    again = run_live(lara.name, lara.make, env_cfg, stream, resumed_dir, replace(CFG, kill_at=-1), progress=False)
    assert again.stats["resumed_ticks"] == 60
    assert again.succeeded == result.succeeded
    assert again.stats["faults"] == result.stats["faults"] == 1  # the fault before the stop is still counted
    def decisions(folder: Path) -> list[tuple]:  # each tick's action and losses (its timings differ)
        return [(d["action"], d["losses"]) for d in map(json.loads, (folder / LOG).read_text().splitlines())]

    assert decisions(resumed_dir) == decisions(run_dir)


def test_a_run_folder_of_another_stream_is_refused(setting, finished) -> None:
    env_cfg, stream, lara = setting
    run_dir, _ = finished
    other = Stream(stream.horizon, stream.jobs[1:], stream.meta)
    with pytest.raises(ConfigError, match="holds another live run"):
        run_live(lara.name, lara.make, env_cfg, other, run_dir, CFG, progress=False)


def test_a_live_run_logs_each_jobs_curve_to_mlflow(finished) -> None:
    run_dir, result = finished
    client = mlflow.MlflowClient(f"sqlite:///{run_dir.parents[1] / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == LIVE_EXPERIMENT]
    (run,) = client.search_runs([experiment.experiment_id])
    metrics = run.data.metrics
    assert metrics["success_rate"] == result.success_rate and "overhead_ms_median" in metrics
    assert metrics["matching_decisions"] == metrics["decisions"] == CFG.horizon
    known = result.stats["known_points"]
    first = int(np.flatnonzero(known)[0])
    history = client.get_metric_history(run.info.run_id, f"loss/job-{first:04d}")
    assert len(history) == known[first]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"timeline.png", "curves.png", "ticks.jsonl", "bank.parquet"} <= artifacts


def test_live_compare_sets_finished_runs_beside_the_simulator(setting, finished, smoke_bank, tmp_path) -> None:
    """`live-compare` reads a finished run back (no Ray needed) and writes its table where told."""
    _, stream, lara = setting
    run_dir, result = finished
    main(["live-compare", "--profile", "smoke", "--bank", str(smoke_bank), "--methods", "lara", "--streams", "1",
          "--stream-seed", str(CFG.stream_seed), "--out", str(run_dir.parent), "--results", str(tmp_path)])
    (row,) = json.loads((tmp_path / "live.json").read_text())
    assert row["stream"] == CFG.stream_seed and row["jobs"] == len(stream.jobs)
    assert row["live"] == result.success_rate and row["replay_exact"] and row["faults"] == 1
    env_cfg = live_env_config(SMOKE_PROFILE, smoke_bank, CFG)
    assert row["simulated"] == predicted_success(lara.make, lara.env_config(env_cfg), stream)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.json", "live.md", "live.png"]
    assert "| lara |" in (tmp_path / "live.md").read_text()


def test_a_batch_resumes_from_its_rows_and_refuses_rows_of_other_inputs(finished, smoke_bank, tmp_path) -> None:
    """A batch's rows outlive its run folders: rerun with no runs at all, it keeps its row; a row
    made with other inputs (unless `--fresh`), a row of another batch, a malformed rows file, and a
    finished run that today's method does not reproduce are each refused by name (`--debug`
    raises the error)."""
    run_dir, _ = finished
    results, empty = tmp_path / "results", tmp_path / "no-runs"
    argv = ["live-compare", "--profile", "smoke", "--debug", "--bank", str(smoke_bank), "--streams", "1",
            "--stream-seed", str(CFG.stream_seed), "--results", str(results)]
    main([*argv, "--methods", "lara", "--out", str(run_dir.parent)])
    (row,) = json.loads((results / "live.json").read_text())
    assert len(row["inputs"]) == 16
    main([*argv, "--methods", "lara", "--out", str(empty)])  # no run folder: the row is kept, nothing runs
    assert not list(empty.glob("*")) and json.loads((results / "live.json").read_text()) == [row]

    (results / "live.json").write_text(json.dumps([{**row, "inputs": "0" * 16}]))
    with pytest.raises(ConfigError, match="made with other inputs"):
        main([*argv, "--methods", "lara", "--out", str(empty)])
    main([*argv, "--methods", "lara", "--out", str(run_dir.parent), "--fresh"])  # the row made again
    assert json.loads((results / "live.json").read_text()) == [row]
    (results / "live.json").write_text(json.dumps([{**row, "stream": row["stream"] + 1}]))
    with pytest.raises(ConfigError, match="rows of another batch"):
        main([*argv, "--methods", "lara", "--out", str(empty)])
    (results / "live.json").write_text("[{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        main([*argv, "--methods", "lara", "--out", str(empty)])

    # EDF handed LARA's finished run: its replay makes other decisions, so the run is not read back.
    shutil.copytree(run_dir, tmp_path / "runs" / run_dir.name.replace("lara", "edf"))
    with pytest.raises(ConfigError, match="does not give its recorded check"):
        main([*argv[:-1], str(tmp_path / "edf-results"), "--methods", "edf", "--out", str(tmp_path / "runs")])


def test_the_ranking_table_counts_streams_won_tied_and_lost_live() -> None:
    """MARA ahead of B by one job of 40 on 5 streams, behind on 1, tied on 10: +0.63 points
    live, a split a fair coin gives with p = 2·(1 + 6)/64; B's family prediction puts MARA
    behind, so the table says the two rank them on different sides. C is MARA's copy."""
    live_gap = [1] * 5 + [-1] + [0] * 10
    rows = []
    for stream, gap in enumerate(live_gap):
        for method, live, family in (("mara", 20, 0.5), ("b", 20 - gap, 0.51), ("c", 20, 0.5)):
            rows.append({"stream": stream, "method": method, "live": live / 40, "simulated_family": family})
    intervals = ranking_intervals(rows)
    assert intervals["c"] == {"live": (0.0, 0.0), "simulated_family": (0.0, 0.0)}
    assert intervals["b"]["live"][0] < 0.25 / 40 < intervals["b"]["live"][1]
    lines = ranking_table(rows, intervals).splitlines()
    b, c = (next(line for line in lines if line.startswith(f"| {m} |")).split(" | ") for m in "bc")
    assert b[1].startswith("+0.63 [") and b[2].startswith("-1.00 [-1.00, -1.00]")
    assert b[3:5] == ["NO", "5 / 10 / 1"] and float(b[5].rstrip(" |")) == pytest.approx(14 / 64, abs=5e-4)
    assert c[3:5] == ["tie", "0 / 16 / 0"] and c[5] == "1.000 |"
    assert sign_test_p(0, 0) == 1.0 and sign_test_p(6, 0) == pytest.approx(2 / 64)


def test_a_tick_that_trains_nothing_logs_no_losses(tmp_path) -> None:
    recorder = Recorder(TickLog(tmp_path / LOG), lambda work: [np.full(a.stop - a.start, 0.5) for a in work])
    recorder.begin(0)
    recorder([Assignment(task=3, node=0, start=0, stop=1)])
    assert list(recorder.losses) == [3]
    recorder.begin(1)  # every node idle, or serving a job at its cap: the env asks for nothing
    assert recorder.losses == {}


def test_placement_keeps_jobs_on_their_nodes_and_serves_the_same_set() -> None:
    placement = Placement()
    # Slots 0..4 hold tasks 10..14; no node has served anything yet.
    env = SimpleNamespace(slot_task=np.array([10, 11, 12, 13, 14, -1]), node_task=np.full(4, -1))
    first = placement.place(np.array([3, 0, 5, 1]), env)  # tasks 12, 14, 10
    assert first.tolist() == [3, 5, 1, 0]
    env.node_task = np.array([12, 14, 10, -1])
    # Task 10 continues, task 12 pauses, task 13 is new: 10 stays on node 2, 13 takes node 0.
    second = placement.place(np.array([4, 1, 0, 0]), env)
    assert sorted(second[second > 0]) == [1, 4] and second[2] == 1
    env.node_task = np.array([13, -1, 10, -1])
    # Task 12 resumes on node 0, which served it two ticks ago and is free again (13 pauses).
    third = placement.place(np.array([3, 1, 0, 0]), env)
    assert third.tolist() == [3, 0, 1, 0]
    env.node_task = np.array([12, -1, 10, -1])
    # 13 and 12 both last ran on node 0: the one running there now keeps it.
    assert placement.place(np.array([4, 3, 0, 0]), env).tolist() == [3, 4, 0, 0]


def test_streams_round_trip_and_malformed_ones_are_named(setting, tmp_path) -> None:
    _, stream, _ = setting
    path = save_stream(stream, tmp_path / "s.json")
    assert load_stream(path) == stream
    assert generate_stream(setting[0], CFG.stream_seed) == stream  # same seed, same stream
    bank_seeds = set(load_bank(setting[0].bank_path)["seed"])
    assert not bank_seeds & {j.seed for j in stream.jobs}  # fresh runs, not the bank's
    good = {"kind": "mlp_digits", "seed": 1, "eps": 0.3, "arrival": 5, "window": 50}
    cases = {
        "arrival order": [good, {**good, "arrival": 2}],
        "eps must be a positive": [{**good, "eps": -1.0}],
        "not a bank family": [{**good, "kind": "nope"}],
        "must state batch_size": [{**good, "kind": "mara_fm.families:FAMILIES"}],
        "not a job stream": [{"kind": "mlp_digits"}],
    }
    for message, jobs in cases.items():
        (tmp_path / "bad.json").write_text(json.dumps({"horizon": 100, "jobs": jobs}))
        with pytest.raises(ConfigError, match=message):
            load_stream(tmp_path / "bad.json")
    assert JobSpec("mlp_digits", 1, 0.3, 5, 50) == load_stream(path).jobs[0].__class__("mlp_digits", 1, 0.3, 5, 50)


def test_live_env_refuses_simulated_speeds_and_held_decisions(setting) -> None:
    """Live jobs run on real workers tick by tick: no simulated node speeds, a decision every tick."""
    env_cfg, stream, _ = setting
    curves = GrowingCurves.for_stream(stream, 300)
    for change, message in (({"cluster": ClusterConfig(restore_lo=1, restore_hi=2)}, "paper's nodes"),
                            ({"decision_interval": 10}, "decide every tick")):
        with pytest.raises(ConfigError, match=message):
            LiveEnv(replace(env_cfg, **change), curves, trainer=lambda work: [])
