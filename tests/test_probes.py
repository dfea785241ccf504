"""Smoke tests of the probes in experiments/probes: each runs at toy size on the smoke bank
and writes a table whose figures lie in range."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from experiments.probes import common, select_predictor
from experiments.probes.rollout_labels import RolloutLabeller, candidates
from experiments.probes.rollout_probe import label_share
from mara_common.config import ConfigError
from mara_common.profile import Profile
from mara_env.env import PENDING, EnvConfig, MultiNodeEnv
from mara_env.registry import ALLOCATORS
from mara_fm.bank import load_bank, select
from mara_fm.eval_predictor import make_queries, reference_curves
from mara_fm.fm_data import split_curves
from mara_fm.fm_model import FlowModel
from mara_fm.predictors import FMPredictor, save_memory
from mara_rl.evaluate import pooled_episodes
from mara_rl.imitation import Demonstrations
from mara_rl.mat_module import MATConfig
from mara_rl.policy import act, export_policy, load_policy, module_spec
from mara_rl.scheduler_config import scheduler_config, training_env
from tests.test_cluster import CLUSTER as CLUSTER_CONFIG

SMOKE = ["--profile", "smoke"]
CLUSTER = dataclasses.asdict(CLUSTER_CONFIG)  # the cluster profile's, as profile settings


def probe(name: str) -> ModuleType:
    """experiments.probes.<name> (the probes are run from the project root, as modules)."""
    return importlib.import_module(f"experiments.probes.{name}")


def tables(path: Path) -> list[list[list[str]]]:
    """The Markdown tables of a file: per table, its body rows as lists of cells."""
    found: list[list[list[str]]] = []
    current: list[list[str]] | None = None
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            current = None
        elif set(line) <= set("|-"):
            current = []
            found.append(current)
        elif current is not None:
            current.append([c.strip() for c in line.strip("|").split("|")])
    return found


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def percent(cell: str) -> float:
    value = number(cell)
    assert 0.0 <= value <= 100.0, cell
    return value


@pytest.fixture(scope="module")
def fm_dir(untrained_fm, smoke_bank, tmp_path_factory) -> Path:
    """The untrained FM exported with a memory of the smoke bank's ID train curves, as
    `train-predictor` leaves it."""
    folder = untrained_fm.export(tmp_path_factory.mktemp("probes") / "fm")
    save_memory(select(load_bank(smoke_bank), "id", "train"), folder)
    return folder


def run(name: str, smoke_bank: Path, tmp_path: Path, *args: str) -> Path:
    path = probe(name).main([*SMOKE, "--bank", str(smoke_bank), "--out", str(tmp_path), *args])
    assert path.parent == tmp_path and path.is_file()
    return path


@pytest.mark.parametrize("name, flag, value, error", [
    ("quantile_probe", "--quantiles", "0.15,half", "cannot read 'half'"),
    ("calibrate_workload", "--unreachable", "0.1,,x", "cannot read 'x'"),
    ("calibrate_workload", "--window", "1.3-2.4,wide", "'wide' should be LO-HI"),
    ("select_predictor", "--epochs", "25,many", "cannot read 'many'"),
])
def test_a_comma_flag_names_itself_and_the_item_it_cannot_read(smoke_bank, tmp_path, name, flag, value, error):
    out = tmp_path / "out"
    work = ["--work", str(tmp_path / "work")] if name == "select_predictor" else []  # its required folder
    with pytest.raises(ConfigError, match=rf"{flag}: {error}"):
        probe(name).main([*SMOKE, "--bank", str(smoke_bank), "--out", str(out), *work, flag, value])
    assert not out.exists()


def test_twins_probe(smoke_bank, fm_dir, tmp_path):
    twins_probe = probe("twins_probe")
    frame = load_bank(smoke_bank)
    row = frame[frame["split"] == "val"].iloc[0]
    # Trained again from its own seed at its own settings, a job is the bank's curve, loss for loss.
    np.testing.assert_array_equal(twins_probe.twin_losses(row.family, int(row.seed), int(row.batch_size),
                                                          float(row.lr), len(row.losses)), row.losses)
    # Twins that are the curve itself forecast the truth, shifted or not.
    train, val = split_curves(frame)
    q = make_queries(val, reference_curves(val, train))
    for shifted in (False, True):
        np.testing.assert_array_equal(twins_probe.twin_forecast(val.avg[:, None, :].repeat(2, 1), q, shifted),
                                      q.truth)

    path = run("twins_probe", smoke_bank, tmp_path, "--twins", "1", "--workers", "1", "--fm", str(fm_dir))
    [rows] = tables(path)
    assert [r[0] for r in rows] == ["wls", "fm", "history", "history, kinds withheld", "twins", "twins, shifted"]
    wls = number(rows[0][1])
    for r in rows:
        assert number(r[1]) >= 0 and number(r[2].rstrip("%")) == pytest.approx(100 * (number(r[1]) / wls - 1),
                                                                                abs=0.06)


def test_calibrate_workload_scan(smoke_bank, fm_dir, tmp_path):
    path = run("calibrate_workload", smoke_bank, tmp_path, "--episodes", "1", "--demand", "30-150,80-280",
               "--window", "1.3-2.4", "--unreachable", "0.2", "--fit-horizon", "yes", "--fm", str(fm_dir))
    assert path.name == "calibrate_workload.md"
    [rows] = tables(path)
    assert len(rows) == 2
    for row in rows:
        fifo, edf, lara, lara_fm, lara_true, oracle, utilisation = map(percent, row[4:11])
        assert oracle >= max(fifo, edf, lara, lara_fm, lara_true)  # the bound holds for every policy
        assert math.isclose(number(row[11]), oracle - lara, abs_tol=0.11)


def test_commitment_probe(smoke_bank, fm_dir, tmp_path):
    path = run("commitment_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "1",
               "--starts", "100,200,300", "--lengths", "1,20", "--load", "0.08", "--predictor", f"fm:{fm_dir}")
    [rows] = tables(path)
    assert [row[0] for row in rows] == ["1", "20"]
    for _, tried, changed, gains, losses, _ in rows:
        contended, copies = map(int, tried.split("/"))
        assert copies == 3 and 0 <= contended <= copies
        assert int(gains) + int(losses) <= contended
        if contended:
            percent(changed)


def test_planning_probe(smoke_bank, fm_dir, tmp_path):
    path = run("planning_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "1",
               "--sigmas", "0.2", "--fm", str(fm_dir))
    [rows] = tables(path)
    assert [row[0] for row in rows] == ["wls", "fm", "fm, reach from the truth", "fm, amount from the truth",
                                        "true demand", "true × exp(0.2·z)"]
    assert all(len(row) == 4 and all(0 <= percent(c) for c in row[1:]) for row in rows)

    path = run("planning_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "1",
               "--by-family", "--fm", str(fm_dir))
    assert path.name == "planning_probe_by_family.md"
    [rows] = tables(path)
    assert len(rows) == 8  # the ID families
    for _, tasks, reach, no_reach, _, teacher in rows:
        assert int(tasks) >= 0
        assert all(0.0 <= number(c) <= 1.0 for c in (reach, no_reach) if c != "–")
        percent(teacher)


def test_history_probe(smoke_bank, fm_dir, tmp_path):
    """Builds the smoke profile's history bank on first use, then compares settings on ID val."""
    path = run("history_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "1",
               "--settings", "5:20,10:all", "--fm", str(fm_dir))
    [val] = tables(path)
    assert [row[:2] for row in val] == [["5", "20"], ["10", "all"]]
    assert all(0 <= percent(row[2]) for row in val)
    assert "Best on validation: k = " in path.read_text()


def test_persistence_probe(smoke_bank, fm_dir, tmp_path):
    path = run("persistence_probe", smoke_bank, tmp_path, "--fm", str(fm_dir), "--back", "0.5", "--ahead", "20")
    [rows] = tables(path)
    *ranks, total = rows
    assert total[0] == "all" and int(total[1]) == sum(int(r[1]) for r in ranks) > 0
    assert len({r[0] for r in ranks}) == len(ranks)
    for row in rows:
        assert number(row[2]) >= 0 and number(row[3]) >= 0
        assert all(math.isnan(number(c)) or -1 <= number(c) <= 1 for c in row[4:])


def test_a_forecast_starts_at_the_observed_loss(untrained_fm, smoke_bank):
    """The probe's interpolation of FM's paths reads L_cur at the prefix's own length."""
    persistence = probe("persistence_probe")
    test = select(load_bank(smoke_bank), "id", "test")
    q = make_queries(test, reference_curves(test, None))
    at_start = persistence.median_log_level(untrained_fm, q.hist, q.horizon, q.hist.lengths)
    np.testing.assert_allclose(at_start, np.log(q.hist.current), rtol=0, atol=1e-9)
    later = persistence.median_log_level(untrained_fm, q.hist, q.horizon, q.hist.lengths + 5)
    assert not np.allclose(later, at_start)


def test_quantile_probe(smoke_bank, fm_dir, tmp_path, untrained_fm):
    m = untrained_fm.samples
    same = 0.5 / (m - 1)  # round(q·(M − 1)) = 0 here as at q = 0: the same estimate
    path = run("quantile_probe", smoke_bank, tmp_path, "--fm", str(fm_dir), "--roots", "1",
               "--episodes-per-root", "2", "--quantiles", f"0,{same / 2:g},0.5", "--reference", "0",
               "--sampler-seeds", "0,1", "--rules", "lara_optimistic")
    assert path.name == "quantile_probe_smoke.md"
    rows, by_size = tables(path)
    assert "- lara_optimistic: " in path.read_text()  # two draws: the per-episode choice of q
    assert [(r[0], r[2]) for r in rows] == [("lara_optimistic", "0"), ("lara_optimistic", "0"),
                                            ("lara_optimistic", str(round(0.5 * (m - 1))))]
    reference, twin, median = rows
    assert reference[5] == "—" and twin[5] == "+0.00 [+0.00, +0.00]"
    for row in rows:
        draws = [percent(x) for x in row[4].split(" / ")]
        assert len(draws) == 2 and percent(row[3]) == pytest.approx(np.mean(draws), abs=0.01)
    # the terciles of the episodes' task counts partition the episodes: their weighted means are the rule's
    sizes = np.array([int(r[2]) for r in by_size])
    assert sizes.sum() == 2
    for column, row in zip(range(3, 6), rows, strict=True):
        split = np.array([percent(r[column]) for r in by_size])
        assert float(split @ sizes) / 2 == pytest.approx(percent(row[3]), abs=0.02)
    path = run("quantile_probe", smoke_bank, tmp_path, "--fm", str(fm_dir), "--roots", "1", "--stress",
               "--quantiles", "0,0.15", "--hold", "10")
    assert path.name == "quantile_probe_smoke_stress_hold10.md" and [len(t) for t in tables(path)] == [4]
    path = run("quantile_probe", smoke_bank, tmp_path, "--fm", str(fm_dir), "--trainer-episodes",
               "--quantiles", "0.15")
    assert path.name == "quantile_probe_smoke_trainer.md" and "of the scheduler trainer" in path.read_text()
    with pytest.raises(SystemExit):
        run("quantile_probe", smoke_bank, tmp_path, "--fm", str(fm_dir), "--stress", "--trainer-episodes")


def test_per_episode_choice_of_q_counts_only_what_holds_across_draws():
    choice = probe("quantile_probe").per_episode_choice
    # episode 0 always does best at q = 0, episode 1 at q = 0.5: a choice per episode gains 50 over either q
    steady = {0.0: np.array([[100.0, 0.0]] * 3), 0.5: np.array([[0.0, 100.0]] * 3)}
    assert choice(steady) == (100.0, 50.0)
    # which q wins flips from draw to draw: the choice made on the other draws gains nothing
    noisy = {0.0: np.array([[100.0], [0.0]]), 0.5: np.array([[0.0], [100.0]])}
    assert choice(noisy) == (0.0, 0.0)


def test_select_predictor(smoke_bank, mlflow_store, tmp_path):
    path = run("select_predictor", smoke_bank, tmp_path, "--work", str(tmp_path / "work"),
               "--networks", "tiny", "--epochs", "1", "--inputs", "level,interval", "--members", "1,2",
               "--seeds", "2")
    [rows] = tables(path)
    assert [r[0] for r in rows] == ["t1", "t1-e2", "t1-interval", "t1-interval-e2"]
    for _, params, epochs, prior, wide, mae, folds, seeds, _ in rows:
        assert (epochs, prior, wide) == ("1", "off", "no")
        assert number(params) > 0 and 0 <= number(mae) < math.inf and number(folds) == number(mae)
        # The rule reads the mean over the training replicates, which differ by their seeds alone.
        per_seed = [number(x) for x in seeds.split(" / ")]
        assert len(per_seed) == 2 and per_seed[0] != per_seed[1]
        assert number(mae) == pytest.approx(sum(per_seed) / 2, abs=0.01)
    # The interval encoding's 5th GRU input costs 3 × hidden weights; the rule prefers the fewer.
    assert number(rows[2][1]) - number(rows[0][1]) == 3 * 8
    # An ensemble counts its members' parameters; its second member is the same network with the next seed.
    assert number(rows[1][1]) == 2 * number(rows[0][1]) and rows[1][5] != rows[0][5]
    assert sum(r[8] == "yes" for r in rows) == 1
    work = tmp_path / "work"
    inputs = json.loads((work / "t1-interval-mlp_diabetes+logreg_cancer" / "inputs.json").read_text())
    assert inputs["config"]["interval_window"] == 1
    member = json.loads((work / "t1-seed1-mlp_diabetes+logreg_cancer" / "inputs.json").read_text())["config"]
    assert member["seed"] == 1 and {**member, "seed": 0} == inputs["config"] | {"interval_window": 0}
    # The second replicate of the two-member ensemble is the next two seeds.
    assert {p.name for p in work.iterdir() if p.name.startswith("t1-seed")} == {
        f"t1-seed{k}-mlp_diabetes+logreg_cancer" for k in (1, 2, 3)}
    # --sampling scores the same trained fold networks with M crossings and S Euler steps.
    parser = common.probe_parser("select_predictor")
    select_predictor.add_grid_flags(parser)
    _, sel = select_predictor.parse_selection(parser, [*SMOKE, "--bank", str(smoke_bank), "--work", str(work),
                                                       "--networks", "tiny", "--epochs", "1", "--sampling", "4,1"])
    resampled = select_predictor.fold_predictor(sel, work, "t1", sel.folds[0])
    as_trained = select_predictor.fold_predictor(dataclasses.replace(sel, sampling=None), work, "t1", sel.folds[0])
    assert (resampled.samples, resampled.cfg.euler_steps) == (4, 1) and as_trained.samples != 4
    assert all(torch.equal(a, b) for a, b in zip(resampled.model.state_dict().values(),
                                                 as_trained.model.state_dict().values(), strict=True))


def test_ensemble_pools_its_members_samples(untrained_fm, smoke_bank):
    torch.manual_seed(1)
    other = FMPredictor(FlowModel(untrained_fm.cfg).eval(), untrained_fm.cfg, untrained_fm.stats)
    test = select(load_bank(smoke_bank), "id", "test")
    q = make_queries(test, reference_curves(test, None))
    pooled = select_predictor.ensemble([untrained_fm, other])
    samples = pooled.sorted_crossings(q.hist, q.eps, q.horizon)
    parts = [m.sorted_crossings(q.hist, q.eps, q.horizon) for m in (untrained_fm, other)]
    np.testing.assert_array_equal(samples, np.sort(np.concatenate(parts, axis=1), axis=1))
    assert pooled.samples == samples.shape[1] == 2 * untrained_fm.samples
    assert not np.array_equal(parts[0], parts[1])
    # Median and optimistic order statistic are read from the pooled samples.
    band = pooled.remaining_batches(q.hist, q.eps, q.horizon, optimistic=0.15)
    m = samples.shape[1]
    np.testing.assert_allclose(band[:, 0], 0.5 * (samples[:, m // 2 - 1] + samples[:, m // 2]))
    assert select_predictor.ensemble([untrained_fm]) is untrained_fm


def test_selection_grid_names_every_dimension():
    grid = select_predictor.candidates(["small"], [25], ["mixture"], ("wide",), ("level", "interval16", "no-lr"),
                                       (None, 6000))
    assert list(grid) == ["s25-mixture-wide", "s25-mixture-wide-x6000", "s25-mixture-wide-interval16",
                          "s25-mixture-wide-interval16-x6000", "s25-mixture-wide-no-lr", "s25-mixture-wide-no-lr-x6000"]
    assert "prior_curves" not in grid["s25-mixture-wide"] and grid["s25-mixture-wide-x6000"]["prior_curves"] == 6000
    assert grid["s25-mixture-wide-interval16"]["interval_window"] == 16
    assert grid["s25-mixture-wide-no-lr"]["lr_input"] is False and "lr_input" not in grid["s25-mixture-wide"]
    longer = select_predictor.candidates(["small"], [25], ["mixture"], ("wide",), ("points24",))
    assert longer["s25-mixture-wide-points24"] == {**grid["s25-mixture-wide"], "max_points": 24, "recent_points": 12}


def test_spread_probe_scores_the_selection_folds_predictor(smoke_bank, fm_dir, mlflow_store, tmp_path):
    grid = ["--work", str(tmp_path / "work"), "--networks", "tiny", "--epochs", "1"]
    [[selected]] = tables(run("select_predictor", smoke_bank, tmp_path / "select", *grid))
    path = run("spread_probe", smoke_bank, tmp_path, *grid, "--temperatures", "1,2", "--fm", str(fm_dir))
    rows = tables(path)[0]
    assert [r[0] for r in rows] == ["1", "2"] and sum(r[-1] == "yes" for r in rows) == 1
    # At τ = 1 the fold's FM is the one the selection scored, on the same held-out queries.
    assert number(rows[0][1]) == number(selected[5])
    for row in rows:
        assert all(0 <= number(c) for c in row[1:4]) and 0 <= number(row[6]) <= 1


def test_recall_folds_probe_falls_back_to_the_folds_fm(smoke_bank, fm_dir, mlflow_store, tmp_path):
    grid = ["--work", str(tmp_path / "work"), "--networks", "tiny", "--epochs", "1"]
    path = run("recall_folds_probe", smoke_bank, tmp_path, *grid, "--shifts", "0.1,inf", "--distances", "inf",
               "--fm", str(fm_dir), "--teacher", "--roots", "1", "--episodes-per-root", "1")
    rows, teacher = tables(path)
    assert [r[0] for r in teacher] == ["FM", "recall, defaults", "recall, pick"]
    assert len({tuple(r[1:]) for r in teacher}) == 1  # recall is FM here, so the teacher plays alike
    assert [(r[0], r[1], r[2]) for r in rows] == [("0.1", "inf", "inf"), ("inf", "inf", "inf")]
    assert sum("(picked)" in r[-1] for r in rows) == 1
    # No smoke kind has M memory runs, so recall is each fold's FM on the unseen side.
    assert all(r[6] in ("+0.0%", "-0.0%") and r[7] == "0%" for r in rows)


def test_a_temperature_scales_fms_base_noise_only(untrained_fm, smoke_bank):
    spread = probe("spread_probe")
    train, val = split_curves(load_bank(smoke_bank))
    q = make_queries(val, reference_curves(val, train))
    same, wider = spread.TemperedFM(untrained_fm, 1.0), spread.TemperedFM(untrained_fm, 2.0)
    np.testing.assert_array_equal(same.sorted_crossings(q.hist, q.eps, q.horizon),
                                  untrained_fm.sorted_crossings(q.hist, q.eps, q.horizon))
    assert not np.array_equal(wider.sorted_crossings(q.hist, q.eps, q.horizon),
                              untrained_fm.sorted_crossings(q.hist, q.eps, q.horizon))
    assert wider.model is untrained_fm.model


def test_selection_over_priors_and_wide_families_then_their_scheduler_consequence(smoke_bank, smoke_wide_bank,
                                                                                  mlflow_store, tmp_path):
    grid = ["--work", str(tmp_path / "work"), "--networks", "tiny", "--epochs", "2", "--priors", "off,mixture",
            "--data", "id,wide", "--folds", "mlp_wine+gcn_blocks,cnn_digits+mf_ratings+tfm_charlm", "--sampling", "4,1"]
    path = run("select_predictor", smoke_bank, tmp_path, *grid)
    [rows] = tables(path)
    assert "; fold predictors draw 4 crossings with 1 Euler steps." in path.read_text()
    assert [r[0] for r in rows] == ["t2", "t2-wide", "t2-mixture", "t2-mixture-wide"]
    assert [(r[3], r[4]) for r in rows] == [("off", "no"), ("off", "yes"), ("mixture", "no"), ("mixture", "yes")]
    for row in rows:
        per_fold = [number(x) for x in row[6].split(" / ")]
        assert len(per_fold) == 2 and number(row[5]) == pytest.approx(sum(per_fold) / 2, abs=0.01)
        assert number(row[7]) == number(row[5])  # one training replicate
    assert sum(r[8] == "yes" for r in rows) == 1
    # A wide candidate leaves a fold's wide families out of training; an ID one has none to leave.
    work = sorted(p.name for p in (tmp_path / "work").iterdir() if p.is_dir())
    assert "t2-wide-mlp_wine+gcn_blocks" in work and "t2-mlp_wine" in work and "t2-cnn_digits" in work
    # A predictor trained on the wide bank is keyed by its content too (a rebuilt wide bank refuses a resume).
    inputs = json.loads((tmp_path / "work" / "t2-wide-mlp_wine+gcn_blocks" / "inputs.json").read_text())
    assert inputs["wide_bank_digest"] and "wide_bank_digest" not in json.loads(
        (tmp_path / "work" / "t2-mlp_wine" / "inputs.json").read_text())

    # The same candidates (already trained) drive the teacher and LARA on the held-out families' episodes.
    path = run("unseen_families_probe", smoke_bank, tmp_path, *grid, "--roots", "1", "--episodes-per-root", "1",
               "--crossing-scales", "1,2", "--sampler-seeds", "0,1")
    [table] = tables(path)
    assert "each at FM's sampler seeds [0, 1]; fold predictors draw 4 crossings with 1 Euler steps" in path.read_text()
    assert [r[0] for r in table] == [f"{name}{scale}" for name in ("t2", "t2-wide", "t2-mixture", "t2-mixture-wide")
                                     for scale in ("", " x2")]
    mae_by_name = {r[0]: number(r[5]) for r in rows}
    for name, teacher, lara, mae, calib, on_id, weighted, per_replicate in table:
        assert 0 <= percent(teacher.split()[0]) and 0 <= percent(lara.split()[0]) and 0 <= percent(on_id)
        assert 0 <= number(calib) <= 1
        if name in mae_by_name:
            assert number(mae.split()[0]) == pytest.approx(mae_by_name[name], abs=0.01)
        assert number(weighted) == pytest.approx((number(on_id) + 2 * number(teacher.split()[0])) / 3, abs=0.01)
        assert number(per_replicate) == pytest.approx(number(weighted), abs=0.01)
    # Whether the held-out MAE orders the fold's eight predictors as the teacher does, fold by fold.
    [line] = [x for x in path.read_text().splitlines() if x.startswith("Within a fold, over its 8 predictors")]
    per_fold = line.split("(per fold ")[1].split(";")[0].split(" / ")
    assert len(per_fold) == 2 and all(x == "+nan" or -1 <= float(x) <= 1 for x in per_fold)


def test_rank_correlation_reads_the_order_alone():
    rho = probe("unseen_families_probe").rank_correlation
    x = np.array([3.0, 1.0, 2.0, 5.0])
    assert rho(x, np.exp(x)) == pytest.approx(1.0) and rho(x, -x ** 3) == pytest.approx(-1.0)
    # Ties share their mean rank: (1, 2.5, 2.5, 4) against (1, 2, 3, 4).
    assert rho(np.array([1.0, 2.0, 2.0, 3.0]), np.arange(4.0)) == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4],
                                                                                             np.arange(4))[0, 1])
    assert np.isnan(rho(x, np.ones(4)))


def test_scaled_fm_scales_every_crossing_up_to_the_horizon(untrained_fm, smoke_bank):
    unseen = probe("unseen_families_probe")
    test = select(load_bank(smoke_bank), "id", "test")
    q = make_queries(test, reference_curves(test, None))
    base = untrained_fm.sorted_crossings(q.hist, q.eps, q.horizon)
    doubled = unseen.ScaledFM(untrained_fm, 2.0).sorted_crossings(q.hist, q.eps, q.horizon)
    np.testing.assert_allclose(doubled, np.minimum(2 * base, q.horizon[:, None]))
    assert (doubled > base).any() and unseen.scaled(untrained_fm, 1.0) is untrained_fm


def test_another_sampler_draw_keeps_the_network(untrained_fm, smoke_bank):
    """`resampled` changes FM's fixed starting points only: for one network, an ensemble, a scaled one."""
    unseen = probe("unseen_families_probe")
    test = select(load_bank(smoke_bank), "id", "test")
    q = make_queries(test, reference_curves(test, None))
    torch.manual_seed(1)
    other = FMPredictor(FlowModel(untrained_fm.cfg).eval(), untrained_fm.cfg, untrained_fm.stats)
    for predictor in (untrained_fm, select_predictor.ensemble([untrained_fm, other]),
                      unseen.ScaledFM(untrained_fm, 2.0)):
        draw = predictor.resampled(untrained_fm.cfg.sampler_seed + 1)
        assert type(draw) is type(predictor)
        same = predictor.resampled(untrained_fm.cfg.sampler_seed)
        crossings = predictor.sorted_crossings(q.hist, q.eps, q.horizon)
        np.testing.assert_array_equal(same.sorted_crossings(q.hist, q.eps, q.horizon), crossings)
        assert not np.array_equal(draw.sorted_crossings(q.hist, q.eps, q.horizon), crossings)
    assert untrained_fm.resampled(5).model is untrained_fm.model


def test_success_over_draws_is_the_mean_of_each_draws(untrained_fm, smoke_bank):
    unseen = probe("unseen_families_probe")
    cfg = Profile.load("smoke").section(EnvConfig, "env", bank=str(smoke_bank), task_set="id", split="val",
                                        arrival_prob=0.3)  # contended, so that the draw changes decisions
    episodes = pooled_episodes(cfg, 2, 4)
    each = [common.success(cfg, episodes, untrained_fm.resampled(d)) for d in (0, 3)]
    assert each[0] != each[1]
    assert unseen.success_over_draws(cfg, episodes, untrained_fm, [0, 3]) == pytest.approx(np.mean(each))
    assert unseen.success_over_draws(cfg, episodes, untrained_fm, None) == common.success(cfg, episodes, untrained_fm)


def test_worlds_probe(smoke_bank, fm_dir, tmp_path):
    path = run("worlds_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "1",
               "--worlds", "2", "--fm", str(fm_dir), "--planners", "served,kept,rollout,hindsight")
    (rows,) = tables(path)
    assert len(rows) == 1 and len(rows[0]) == 8 and all(0 <= percent(c) for c in rows[0][1:])


def test_worlds_probe_told_the_true_demand(smoke_bank, fm_dir, tmp_path):
    path = run("worlds_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "1", "--exact",
               "--no-arrivals-ahead", "--fm", str(fm_dir), "--planners", "hindsight")
    assert "forecasts exact" in path.read_text() and "not in the worlds" in path.read_text()
    (rows,) = tables(path)
    assert len(rows) == 1 and len(rows[0]) == 5 and all(0 <= percent(c) for c in rows[0][1:])
    with pytest.raises(SystemExit):  # the sampled-world planners read FM: not with --exact
        run("worlds_probe", smoke_bank, tmp_path, "--exact", "--planners", "rollout", "--fm", str(fm_dir))


def test_worlds_probe_on_recall(smoke_bank, fm_dir, tmp_path):
    # On the smoke bank no kind has M memory runs, so recall answers as FM does: same table.
    args = ["--roots", "1", "--episodes-per-root", "1", "--worlds", "2", "--fm", str(fm_dir),
            "--planners", "rollout"]
    fm = run("worlds_probe", smoke_bank, tmp_path / "fm", *args)
    recall = run("worlds_probe", smoke_bank, tmp_path / "recall", *args, "--recall")
    assert recall.name.endswith("_recall.md") and "forecasts recall" in recall.read_text()
    assert tables(recall) == tables(fm)
    with pytest.raises(SystemExit):  # served and kept read FM's kept samples
        run("worlds_probe", smoke_bank, tmp_path, "--recall", "--planners", "served", "--fm", str(fm_dir))


def told_env(smoke_bank: Path, **settings) -> EnvConfig:
    """A loaded smoke env told every task's true demand."""
    return Profile.load("smoke").section(EnvConfig, "env", bank=str(smoke_bank), task_set="id", split="val",
                                         predictor="oracle", arrival_prob=0.3, **settings)


def contended(cfg: EnvConfig) -> MultiNodeEnv:
    """An env of `cfg` played by the search's teacher into its episode, to a state where a task waits."""
    env = MultiNodeEnv(cfg)
    env.reset(seed=3)
    teacher = ALLOCATORS[probe("worlds_probe").TEACHER]()
    while (env.slot_task >= 0).sum() <= cfg.n_nodes or env.t < 40:
        env.step(teacher.act(env.scheduler_view()))
    return env


def test_the_search_over_every_candidate_decides_by_the_state_alone(smoke_bank):
    """`--alternatives all`: every swap (a served node given a waiting task) and every drop, in node
    order whatever the draw, so the search's choice at a state does not depend on its seed."""
    worlds = probe("worlds_probe")
    env = contended(told_env(smoke_bank, cluster=CLUSTER))
    action = ALLOCATORS[worlds.TEACHER]().act(env.scheduler_view())
    served = int((action > 0).sum())
    waiting = int((env.slot_task >= 0).sum()) - served
    for kind, count in (("drop", served), ("swap", served * waiting)):
        every = [candidates(kind, action, env, None, np.random.default_rng(seed)) for seed in (0, 1)]
        assert len(every[0]) == count and all(np.array_equal(a, b) for a, b in zip(*every, strict=True))
    drawn = {tuple(candidates("swap", action, env, 1, np.random.default_rng(seed))[0]) for seed in range(10)}
    assert len(drawn) > 1  # a drawn candidate is the seed's
    decisions = [worlds.told_search(None, seed)(None, [env.clone()]) for seed in (0, 1)]
    assert np.array_equal(*decisions)
    parser = common.probe_parser("a probe")
    common.add_alternatives_flag(parser)
    assert parser.parse_args(["--alternatives", "all"]).alternatives is None
    assert parser.parse_args(["--alternatives", "2"]).alternatives == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--alternatives", "0"])


def test_candidate_features_describe_the_node_each_candidate_changes(smoke_bank):
    features = probe("candidate_probe")
    env = contended(told_env(smoke_bank, cluster=CLUSTER))
    action = ALLOCATORS[probe("worlds_probe").TEACHER]().act(env.scheduler_view())
    options = [(kind, x) for kind in ("swap", "drop") for x in candidates(kind, action, env, None, np.random.default_rng(0))]
    rows = features.candidate_rows(env, action, options)
    column = {name: rows[:, i] for i, name in enumerate(features.FEATURES)}
    assert rows.shape == (len(options), len(features.FEATURES))
    assert column["drop"].tolist() == [float(kind == "drop") for kind, _ in options]
    swap, swapped = next((i, x) for i, (kind, x) in enumerate(options) if kind == "swap")
    node = int(np.flatnonzero(swapped != action)[0])
    incoming = int(env.slot_task[swapped[node] - 1])
    assert column["speed"][swap] == env.speeds[node]
    assert column["in_demand"][swap] >= env.pred[incoming] / env.speeds[node]
    assert column["in_slack"][swap] == env.deadline[incoming] - env.t - column["in_demand"][swap]
    assert (column["in_demand"][column["drop"] == 1] == 0).all()


def test_candidate_probe(short_cluster, smoke_bank, tmp_path):
    path = probe("candidate_probe").main(["--profile", str(short_cluster), "--bank", str(smoke_bank), "--out", str(tmp_path),
                                          "--episodes", "1", "--held-out", "1", "--hold", "10"])
    [[row]] = tables(path)
    assert int(row[0]) > 0 and int(row[2]) > 0
    assert all(0 <= percent(row[k].rstrip("%")) <= 100 for k in (1, 3))
    taken, best = (number(x) for x in row[6].split("/"))
    assert taken <= best  # the rule takes one of the candidates the search judged, or nothing


def test_draw_probe(short_cluster, smoke_bank, tmp_path):
    """Every ordered pair of labellers gets a row, and where the first leaves the teacher the second
    can take its action only where it leaves the teacher too."""
    path = probe("draw_probe").main(["--profile", str(short_cluster), "--bank", str(smoke_bank), "--out", str(tmp_path),
                                     "--episodes", "1", "--seeds", "1", "--hold", "10"])
    [rows] = tables(path)
    assert [(row[0], row[1]) for row in rows] == [("seed 1", "all"), ("all", "seed 1")]
    for _, _, leaves, too, same in rows:
        assert int(leaves) > 0 and percent(same.rstrip("%")) <= percent(too.rstrip("%"))


@pytest.mark.parametrize("cluster", [False, True])
def test_a_world_at_the_true_crossings_plays_as_the_episode_does(smoke_bank, cluster):
    """The rollout planner's world, built from every task's true crossing and read by the
    teacher as its forecasts, plays out like the env itself with the oracle predictor."""
    worlds = probe("worlds_probe")
    env = contended(told_env(smoke_bank, **({"cluster": CLUSTER} if cluster else {})))
    teacher = ALLOCATORS[worlds.TEACHER]()
    first = teacher.act(env.scheduler_view())
    copy, before, action, done = env.clone(), env.stats["successes"], first, False
    while not done:
        _, _, done, _, _ = copy.step(action)
        action = teacher.act(copy.scheduler_view())
    full = worlds.World(env, worlds.truth(env), {})
    assert full.play(teacher, first, set()) == copy.stats["successes"] - before > 0
    # A world without later arrivals: the tasks still to come never arrive in it.
    later = env.arrival > env.t
    alone = worlds.World(env, worlds.truth(env), {}, arrivals=False)
    alone.play(teacher, first, set())
    assert (full.env.status[later] != PENDING).any() and (alone.env.status[later] == PENDING).all()


def test_rollout_probe(smoke_bank, fm_dir, tmp_path):
    path = run("rollout_probe", smoke_bank, tmp_path, "--roots", "1", "--episodes-per-root", "2",
               "--share", "0.5", "--alternatives", "2", "--fm", str(fm_dir))
    [rows] = tables(path)
    assert [row[0] for row in rows] == ["swap", "drop"]
    for _, states, improved, gain, worse in rows:
        assert int(states) > 0  # the smoke episodes are contended
        improved, worse = percent(improved.rstrip("%")), percent(worse.rstrip("%"))
        assert (number(gain) > 0) == (improved > 0)


def untrained_policy(profile: Profile, bank: Path, out: Path, **settings) -> Path:
    """An untrained MAT exported for the training env of `profile` with these scheduler settings;
    its weights come from a fixed seed, so a test's MAT does not depend on the tests run before it."""
    cfg = scheduler_config(profile, **settings)
    env_cfg = training_env(cfg, profile, bank)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        module = module_spec(env_cfg, cfg.mat).build()
    return export_policy(module, out, env_cfg)


def test_rollout_probe_fits_a_policy_that_decides_at_events(smoke_bank, fm_dir, tmp_path):
    policy = untrained_policy(Profile.load("smoke"), smoke_bank, tmp_path / "policy", predictor="fm",
                              fm_path=str(fm_dir), decision_interval=5)
    path = run("rollout_probe", smoke_bank, tmp_path, "--policy", str(policy), "--rounds", "2", "--episodes", "1",
               "--share", "0.2", "--weight", "3")
    assert path.name == "rollout_fit.md"
    [rows] = tables(path)
    assert [row[0] for row in rows] == ["1", "2"]
    assert sum(int(row[2]) for row in rows) > 0
    for _, labelled, judged, improved, taken, score in rows:
        assert int(labelled) > int(judged) >= 0
        assert improved == "n/a" if judged == "0" else 0 <= percent(improved.rstrip("%"))
        assert taken == "n/a" if improved in ("n/a", "0.0%") else all(
            0 <= percent(x.strip().rstrip("%")) <= 100 for x in taken.split("/"))
        percent(score)


def test_rollout_probe_memorise_fits_copies_on_one_label_set(smoke_bank, fm_dir, tmp_path):
    policy = untrained_policy(Profile.load("smoke"), smoke_bank, tmp_path / "policy", predictor="fm",
                              fm_path=str(fm_dir), decision_interval=5)
    path = run("rollout_probe", smoke_bank, tmp_path, "--policy", str(policy), "--episodes", "1",
               "--share", "1", "--memorise", "3,300")
    assert path.name == "rollout_memorise.md"
    [rows] = tables(path)
    assert [row[0] for row in rows] == ["0", "3", "300"]
    fitted = [percent(row[1].rstrip("%")) for row in rows]
    assert fitted[-1] > fitted[0]  # fitting on them, the MAT takes more of the labels it was fitted on


@pytest.fixture
def short_cluster(tmp_path) -> Path:
    """The profile file of a loaded smoke cluster (`CLUSTER`) with episodes of 200 steps: for the
    probes that play every candidate."""
    toml = tmp_path / "smoke-cluster.toml"
    cluster = "".join(f"{key} = {list(value) if isinstance(value, tuple) else value}\n"
                      for key, value in CLUSTER.items())
    toml.write_text(f'extends = "smoke"\n\n[env]\nhorizon = 200\narrival_prob = 0.08\n\n[env.cluster]\n{cluster}')
    return toml


@pytest.fixture
def told_cluster(short_cluster, smoke_bank, tmp_path) -> tuple[Path, Path]:
    """A loaded smoke cluster of short episodes (its profile file) and an untrained MAT hinted with
    the teacher, in the env told the exact demand, deciding at events."""
    policy = untrained_policy(Profile.load(str(short_cluster)), smoke_bank, tmp_path / "policy",
                              predictor="oracle", decision_interval=5, rule_hint="lara_optimistic")
    return short_cluster, policy


def test_search_clone_probe_fits_the_searchs_rows(told_cluster, smoke_bank, tmp_path):
    """On a loaded smoke cluster the told search leaves the teacher; the hinted MAT starts at the
    teacher, so it copies the search only where the search keeps to it, until it is fitted; a
    DAgger round adds the rows of the MAT's own episodes; the best-validating stage is exported."""
    toml, policy = told_cluster
    path = probe("search_clone_probe").main(["--profile", str(toml), "--bank", str(smoke_bank), "--out", str(tmp_path),
                                             "--policy", str(policy), "--episodes", "2", "--held-out", "2",
                                             "--epochs", "150", "--no-persist-drops", "--dagger-rounds", "1",
                                             "--dagger-episodes", "1", "--export", str(tmp_path / "best")])
    [rows] = tables(path)
    assert [(row[0], row[1]) for row in rows] == [("bc", "0"), ("bc", "150"), ("d1", "300")]
    fitted = [int(row[2]) for row in rows]
    assert fitted[0] == fitted[1] < fitted[2]
    deviates = [percent(x.strip().rstrip("%")) for x in rows[0][3].split("/")]
    assert all(0 < x <= 100 for x in deviates)
    taken = [[percent(row[k].rstrip("%")) for k in (4, 5, 6)] for row in rows]
    assert taken[0][2] > 90 and taken[1][0] > taken[0][0]
    scores = [percent(row[-1]) for row in rows]
    stage, score = (tmp_path / "best" / "stage.txt").read_text().split()
    assert float(score) == max(scores) and stage == rows[scores.index(max(scores))][0]
    assert load_policy(tmp_path / "best").rule_bias is not None
    with pytest.raises(SystemExit):
        run("search_clone_probe", smoke_bank, tmp_path, "--policy", str(policy), "--dagger-rounds", "1")
    unhinted = untrained_policy(Profile.load(str(toml)), smoke_bank, tmp_path / "plain", predictor="oracle")
    with pytest.raises(ConfigError, match="needs a MAT trained with --rule-hint"):
        run("search_clone_probe", smoke_bank, tmp_path, "--policy", str(unhinted))


def test_search_clone_probe_learning_curve(told_cluster, smoke_bank, tmp_path):
    """`--sizes` fits a fresh copy on each growing set of episodes; `--weight` repeats exactly
    the rows where the search leaves the hint."""
    toml, policy = told_cluster
    path = probe("search_clone_probe").main(["--profile", str(toml), "--bank", str(smoke_bank), "--out", str(tmp_path),
                                             "--policy", str(policy), "--sizes", "1,2", "--held-out", "1",
                                             "--epochs", "10", "--weight", "3"])
    [rows] = tables(path)
    assert [(row[0], row[1]) for row in rows] == [("n1", "10"), ("n2", "10")]
    assert 0 < int(rows[0][2]) < int(rows[1][2])
    clone = probe("search_clone_probe")
    obs = {"rule_action": torch.tensor([[1, 2], [1, 2], [0, 0]])}
    demos = Demonstrations(obs=obs, actions=torch.tensor([[1, 2], [2, 1], [0, 1]]), returns=torch.zeros(3))
    assert clone.deviating(demos).tolist() == [False, True, True]
    assert clone.weighted(demos, 3).actions.tolist() == [[1, 2], [2, 1], [0, 1], [2, 1], [0, 1], [2, 1], [0, 1]]
    assert clone.weighted(demos, 1) is demos
    with pytest.raises(SystemExit):
        run("search_clone_probe", smoke_bank, tmp_path, "--policy", str(policy), "--sizes", "2,1")


def test_label_share_counts_the_states_where_the_mat_takes_the_label(smoke_bank):
    env_cfg = EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1)
    module = module_spec(env_cfg, MATConfig()).build().eval()
    env = MultiNodeEnv(env_cfg)
    states = [env.reset(seed=s)[0] for s in range(3)]
    own = RolloutLabeller("edf", 1, 1.0, seed=0)
    own.improved = [(o, act(module, o)) for o in states]
    assert label_share(module, own) == 1.0
    other = RolloutLabeller("edf", 1, 1.0, seed=0)
    other.improved = [(o, (act(module, o) + 1) % (env_cfg.n_slots + 1)) for o in states]
    assert label_share(module, other) == 0.0


def test_hold_probe(smoke_bank, fm_dir, tmp_path):
    path = run("hold_probe", smoke_bank, tmp_path, "--intervals", "5,50", "--episodes", "2", "--fm", str(fm_dir))
    [rows] = tables(path)
    assert [row[0] for row in rows] == ["lara_optimistic", "llf"]
    for row in rows:
        assert len(row) == 4
        for cell in row[1:]:
            percent(cell)


def test_trend_probe(smoke_bank, fm_dir, tmp_path):
    path = run("trend_probe", smoke_bank, tmp_path, "--probe-points", "4", "--train-episodes", "1",
               "--val-episodes", "1", "--episodes", "1", "--taus", "0.2,0.5", "--fm", str(fm_dir))
    classifier, scheduling = tables(path)
    assert [row[0] for row in classifier] == ["teacher's rule", "FM", "FM + trend"]
    for _, auc, loss, accuracy in classifier[1:]:
        assert 0.0 <= number(auc) <= 1.0 and number(loss) >= 0.0
        percent(accuracy)
    assert [row[0] for row in scheduling] == ["FM", "FM + trend"]
    assert all(len(row) == 3 and all(0.0 <= percent(c) for c in row[1:]) for row in scheduling)


def test_trend_probe_refuses_a_profile_that_does_not_judge_tasks(smoke_bank, fm_dir, tmp_path):
    with pytest.raises(ConfigError, match="probe_points"):
        run("trend_probe", smoke_bank, tmp_path, "--fm", str(fm_dir))


def _policies(smoke_bank: Path, fm_dir: Path, tmp_path: Path, count: int) -> tuple[EnvConfig, list[Path]]:
    """`count` untrained MAT policies of the smoke profile, distinct weights, FM inside, and their env."""
    profile = Profile.load("smoke")
    cfg = scheduler_config(profile, predictor="fm", fm_path=str(fm_dir))
    env_cfg = training_env(cfg, profile, smoke_bank)
    paths = []
    for seed in range(count):
        torch.manual_seed(seed)
        paths.append(export_policy(module_spec(env_cfg, cfg.mat).build(), tmp_path / f"policy{seed}", env_cfg))
    return env_cfg, paths


def test_an_ensemble_of_one_policy_acts_as_the_policy(smoke_bank, fm_dir, tmp_path):
    ensemble_probe = probe("ensemble_probe")
    env_cfg, paths = _policies(smoke_bank, fm_dir, tmp_path, 2)
    first, second = (load_policy(p) for p in paths)
    env = MultiNodeEnv(dataclasses.replace(env_cfg, strict=True))  # an invalid joint action raises
    obs, _ = env.reset(seed=3)
    seen = []
    for _ in range(60):
        seen.append(obs)
        obs, *_ = env.step(ensemble_probe.ensemble_act([first, second], {k: v[None] for k, v in obs.items()})[0])
    batch = {k: np.stack([o[k] for o in seen]) for k in seen[0]}
    assert np.array_equal(ensemble_probe.ensemble_act([first], batch), act(first, batch))
    assert np.array_equal(ensemble_probe.ensemble_act([first, first], batch), act(first, batch))
    assert not np.array_equal(act(first, batch), act(second, batch))  # the two members differ


def test_ensemble_probe(smoke_bank, fm_dir, tmp_path):
    a, b, c, d = (str(p) for p in _policies(smoke_bank, fm_dir, tmp_path, 4)[1])
    path = run("ensemble_probe", smoke_bank, tmp_path, "--groups", f"e0={a}+{b},e1={c}+{d}", "--rules", "edf,lara",
               "--roots", "1", "--episodes-per-root", "2", "--first-root", "1", "--fm", str(fm_dir))
    groups, versus = tables(path)
    assert [row[:2] for row in groups] == [["e0", "2"], ["e1", "2"]]
    for _, _, together, alone, gain in groups:
        members = [percent(x) for x in alone.split(" / ")]
        assert number(gain) == pytest.approx(percent(together) - np.mean(members), abs=0.011)
    assert [row[0] for row in versus] == ["edf", "lara"]
    with pytest.raises(ConfigError, match="should be NAME=POLICY_DIR"):
        probe("ensemble_probe").main([*SMOKE, "--bank", str(smoke_bank), "--groups", "e0", "--out", str(tmp_path)])
