"""Bad inputs to the `mara` CLI and its loaders: each must end in ONE line on stderr,
`mara <command>: error: <cause> (--debug shows the traceback)`, with exit code 2, and
before any expensive work; `--debug` re-raises instead."""

from __future__ import annotations

import json
import math
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mara_common.config import ConfigError
from mara_common.paths import PROFILE_DIR
from mara_common.profile import Profile
from mara_fm.bank import BankError, load_bank, save_bank
from mara_fm.eval_predictor import QueryConfig, bank_query_sets
from mara_fm.predictors import FMPredictor
from mara_fm.predictors.fm import CONFIG_FILE, WEIGHTS_FILE, ArtifactError
from mara_fm.train_predictor import train_predictor
from mara_fm.wide_families import WIDE_FAMILIES
from mara_rl.cli import build_parser, main
from mara_rl.live_commands import planned_live

SMOKE_TOML = (PROFILE_DIR / "smoke.toml").read_text()
SUFFIX = " (--debug shows the traceback)"


def fail(argv: list[str], capsys) -> str:
    """Run `mara argv`; assert exit code 2 and exactly one stderr line; return it."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), f"expected one line on stderr, got:\n{err}"
    line = lines[0]
    assert line.startswith(f"mara {argv[0]}: error: ") and line.endswith(SUFFIX), line
    return line


def free_port() -> int:
    """A local port that nobody listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_profile(tmp_path: Path, text: str, name: str = "bad") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def evaluate_argv(tmp_path: Path, bank: Path, *extra: str) -> list[str]:
    """A cheap `mara evaluate` (one rule, one root, one episode, no MLflow) plus `extra`."""
    return ["evaluate", "--bank", str(bank), "--out", str(tmp_path / "eval"), "--methods", "fifo",
            "--roots", "1", "--episodes", "1", "--no-mlflow", *extra]


def assert_nothing_evaluated(tmp_path: Path) -> None:
    assert not (tmp_path / "eval" / "results.json").exists()


# --------------------------------------------------------------------------- 1. profiles


@pytest.mark.parametrize("edit, words", [
    pytest.param(lambda t: t.replace("[env]", "[envv]"), ["unknown section", "envv"], id="misspelt-section"),
    pytest.param(lambda t: t.replace("[env]\n", "[env]\nn_nodez = 7\n"), ["unknown key", "n_nodez"],
                 id="unknown-key"),
    pytest.param(lambda t: t + "\n[scheduler.extra\nx = = 1\n", ["not valid TOML"], id="toml-syntax"),
    pytest.param(lambda t: t.replace("n_nodes = 7", "n_nodes = true"), ["n_nodes", "integer"],
                 id="n_nodes-bool"),
    pytest.param(lambda t: t.replace("n_nodes = 7", 'n_nodes = "7"'), ["n_nodes", "integer"], id="n_nodes-str"),
    pytest.param(lambda t: t.replace("[env]\n", "[env]\nbeta = nan\n"), ["beta", "finite"], id="beta-nan"),
])
def test_profile_errors_via_evaluate(tmp_path, smoke_bank, capsys, edit, words):
    profile = write_profile(tmp_path, edit(SMOKE_TOML))
    line = fail(evaluate_argv(tmp_path, smoke_bank, "--profile", str(profile)), capsys)
    assert str(profile) in line
    for word in words:
        assert word in line
    assert_nothing_evaluated(tmp_path)


def test_curves_wide_builds_the_wide_bank_from_its_own_section(tmp_path, capsys):
    text = SMOKE_TOML.replace("curves_per_id_family = 4\ncap = 300", "curves_per_id_family = 1\ncap = 16")
    assert text != SMOKE_TOML
    out = tmp_path / "wide.parquet"
    main(["curves", "--wide", "--profile", str(write_profile(tmp_path, text, "wide")), "--out", str(out),
          "--workers", "1"])
    frame = load_bank(out)
    assert sorted(frame["family"]) == sorted(WIDE_FAMILIES) and set(frame["task_set"]) == {"wide"}
    assert {len(x) for x in frame["losses"]} == {16}
    broken = write_profile(tmp_path, text.replace("cap = 16", "cap = 1"), "broken")
    line = fail(["curves", "--wide", "--profile", str(broken), "--out", str(tmp_path / "b.parquet")], capsys)
    assert "cap" in line and str(broken) in line


@pytest.mark.parametrize("value", [0, -3])
def test_profile_curves_per_id_family_out_of_bounds(tmp_path, capsys, value):
    profile = write_profile(tmp_path, SMOKE_TOML.replace("curves_per_id_family = 6",
                                                         f"curves_per_id_family = {value}"))
    out = tmp_path / "bank.parquet"
    line = fail(["curves", "--profile", str(profile), "--out", str(out)], capsys)
    assert "curves_per_id_family" in line and str(profile) in line and f"got {value}" in line
    assert not out.exists() and not out.with_suffix(".parts").exists()


def test_profile_predictor_max_epochs_zero(tmp_path, smoke_bank, capsys):
    profile = write_profile(tmp_path, SMOKE_TOML.replace("max_epochs = 8", "max_epochs = 0"))
    out = tmp_path / "predictor"
    line = fail(["train-predictor", "--profile", str(profile), "--bank", str(smoke_bank), "--out", str(out)], capsys)
    assert "max_epochs" in line and str(profile) in line
    assert not (out / "checkpoints").exists()


def test_unknown_profile_name(tmp_path, smoke_bank, capsys):
    line = fail(evaluate_argv(tmp_path, smoke_bank, "--profile", "no_such_profile"), capsys)
    assert "no_such_profile" in line and "not found" in line


# --------------------------------------------------------------------------- 2. mara evaluate


@pytest.mark.parametrize("extra, words", [
    pytest.param(["--load", "abc"], ["--load", "abc"], id="load-abc"),
    pytest.param(["--load", "0.04, ,x"], ["--load", "'x'"], id="load-second-item"),
    pytest.param(["--load", "2"], ["--load", "'2'", "[0, 1]"], id="load-2"),
    pytest.param(["--roots", "0"], ["roots", "got 0"], id="roots-0"),
    pytest.param(["--methods", "fifo,no_such_method"], ["no_such_method", "unknown"], id="unknown-method"),
])
def test_evaluate_bad_arguments(tmp_path, smoke_bank, capsys, extra, words):
    argv = evaluate_argv(tmp_path, smoke_bank, "--profile", "smoke")
    argv += extra  # a later flag wins in argparse
    line = fail(argv, capsys)
    for word in words:
        assert word in line
    assert_nothing_evaluated(tmp_path)


def test_evaluate_out_under_a_regular_file(tmp_path, smoke_bank, capsys, monkeypatch):
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder")
    out = blocker / "sub"
    import mara_rl.cli as cli

    monkeypatch.setattr(cli, "evaluate", lambda *a, **k: pytest.fail("evaluation ran"))
    argv = evaluate_argv(tmp_path, smoke_bank, "--profile", "smoke", "--out", str(out))
    line = fail(argv, capsys)
    assert "--out" in line and str(out) in line and "cannot write" in line


def test_evaluate_policy_without_predictor_key(tmp_path, smoke_bank, capsys):
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.json").write_text(json.dumps({"n_nodes": 7, "n_slots": 16, "model_config": {}}))
    (policy / "policy.pt").write_bytes(b"")
    line = fail(evaluate_argv(tmp_path, smoke_bank, "--profile", "smoke", "--policies", f"mine={policy}"), capsys)
    assert str(policy / "policy.json") in line and "predictor" in line and "missing" in line
    assert_nothing_evaluated(tmp_path)


def test_debug_reraises(tmp_path, smoke_bank, capsys):
    with pytest.raises(ConfigError, match="--load"):
        main(evaluate_argv(tmp_path, smoke_bank, "--profile", "smoke", "--load", "abc", "--debug"))
    assert "error:" not in capsys.readouterr().err


# --------------------------------------------------------------------------- 3. train-scheduler


@pytest.mark.parametrize("extra, words", [
    pytest.param(["--iterations", "-1"], ["iterations", ">= 0", "-1"], id="iterations-negative"),
    pytest.param(["--beta", "nan"], ["beta", "finite"], id="beta-nan"),
])
def test_train_scheduler_bad_settings(tmp_path, smoke_bank, capsys, extra, words):
    out = tmp_path / "run"
    line = fail(["train-scheduler", "--profile", "smoke", "--bank", str(smoke_bank), "--out", str(out), *extra],
                capsys)
    for word in words:
        assert word in line
    assert not any(out.iterdir())  # checked, but nothing trained


def test_train_scheduler_missing_fm_predictor(tmp_path, smoke_bank, capsys, monkeypatch):
    import mara_rl.scheduler_commands as sc

    monkeypatch.setattr(sc, "train", lambda *a, **k: pytest.fail("training started"))
    missing = tmp_path / "no_predictor"
    line = fail(["train-scheduler", "--profile", "smoke", "--bank", str(smoke_bank), "--out", str(tmp_path / "run"),
                 "--predictor", "fm", "--fm-path", str(missing)], capsys)
    assert str(missing) in line and CONFIG_FILE in line


# --------------------------------------------------------------------------- 4. submit-scheduler


def submit_argv(tmp_path: Path, bank: Path, *extra: str) -> list[str]:
    return ["submit-scheduler", "--profile", "smoke", "--predictor", "wls", "--bank", str(bank),
            "--out", str(tmp_path / "run"), *extra]


def test_submit_without_address(tmp_path, smoke_bank, capsys, monkeypatch, mlflow_store):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    line = fail(submit_argv(tmp_path, smoke_bank), capsys)
    assert "set RAY_ADDRESS" in line


def test_submit_to_a_silent_address(tmp_path, smoke_bank, capsys, monkeypatch, mlflow_store):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    address = f"http://127.0.0.1:{free_port()}"
    start = time.monotonic()
    line = fail(submit_argv(tmp_path, smoke_bank, "--address", address), capsys)
    assert time.monotonic() - start < 10
    assert address in line


def test_submit_missing_bank_before_contacting_a_cluster(tmp_path, capsys, monkeypatch, mlflow_store):
    import mara_rl.scheduler_commands as sc

    monkeypatch.setattr(sc, "check_cluster", lambda *a, **k: pytest.fail("contacted the cluster"))
    monkeypatch.setenv("RAY_ADDRESS", f"http://127.0.0.1:{free_port()}")
    bank = tmp_path / "no_bank.parquet"
    line = fail(submit_argv(tmp_path, bank), capsys)
    assert str(bank) in line and "not found" in line


# --------------------------------------------------------------------------- 5. MLflow server down


@pytest.fixture()
def fm_export(untrained_fm, tmp_path) -> Path:
    return untrained_fm.export(tmp_path / "predictor")


@pytest.mark.parametrize("command", ["eval-predictor", "evaluate"])
def test_unreachable_mlflow_server_fails_fast(tmp_path, smoke_bank, fm_export, capsys, monkeypatch, command):
    uri = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    if command == "eval-predictor":
        argv = ["eval-predictor", "--profile", "smoke", "--predictor-path", str(fm_export), "--bank",
                str(smoke_bank), "--out", str(tmp_path / "eval")]
        written = tmp_path / "eval" / "predictor_eval.json"
    else:
        argv = [a for a in evaluate_argv(tmp_path, smoke_bank, "--profile", "smoke") if a != "--no-mlflow"]
        written = tmp_path / "eval" / "results.json"
    start = time.monotonic()
    line = fail(argv, capsys)
    assert time.monotonic() - start < 15
    assert uri in line
    assert not written.exists(), "the server was checked only after the evaluation had run"


# --------------------------------------------------------------------------- 6. predictor artifacts


def poison_weights(folder: Path) -> None:
    state = torch.load(folder / WEIGHTS_FILE, weights_only=True)
    torch.save({k: torch.full_like(v, math.nan) if v.is_floating_point() else v for k, v in state.items()},
               folder / WEIGHTS_FILE)


def test_nan_weights_refused_by_load(fm_export):
    poison_weights(fm_export)
    with pytest.raises(ArtifactError, match=WEIGHTS_FILE) as err:
        FMPredictor.load(fm_export)
    assert "NaN" in str(err.value)


def test_nan_weights_refused_by_eval_predictor(tmp_path, smoke_bank, fm_export, capsys):
    poison_weights(fm_export)
    line = fail(["eval-predictor", "--profile", "smoke", "--predictor-path", str(fm_export), "--bank",
                 str(smoke_bank), "--out", str(tmp_path / "eval"), "--no-mlflow"], capsys)
    assert str(fm_export / WEIGHTS_FILE) in line and "NaN" in line


def test_predictor_config_with_zero_samples(tmp_path, smoke_bank, fm_export, capsys):
    meta = json.loads((fm_export / CONFIG_FILE).read_text())
    meta["config"]["samples"] = 0
    (fm_export / CONFIG_FILE).write_text(json.dumps(meta))
    line = fail(["eval-predictor", "--profile", "smoke", "--predictor-path", str(fm_export), "--bank",
                 str(smoke_bank), "--out", str(tmp_path / "eval"), "--no-mlflow"], capsys)
    assert str(fm_export / CONFIG_FILE) in line and "samples" in line


# --------------------------------------------------------------------------- 7. predictor resume, other bank


def test_train_predictor_resume_with_another_bank(tmp_path, smoke_bank, mlflow_store):
    out = tmp_path / "predictor_run"
    train_predictor("smoke", smoke_bank, out, max_epochs=1, verbose=False)
    frame = load_bank(smoke_bank)
    frame["losses"] = [np.asarray(x) * 0.5 for x in frame["losses"]]
    other = save_bank(frame, tmp_path / "half.parquet")
    with pytest.raises(ConfigError, match="--fresh") as err:
        train_predictor("smoke", other, out, max_epochs=1, verbose=False)
    assert "bank" in str(err.value)
    result = train_predictor("smoke", other, out, max_epochs=1, verbose=False, resume=False)
    assert (result.predictor_path / WEIGHTS_FILE).exists()
    assert json.loads((out / "inputs.json").read_text())["bank"].endswith("half.parquet")


# --------------------------------------------------------------------------- 8. bank loader


def _set_cell(frame, col, value, row=1):
    frame[col] = frame[col].astype(object)
    frame.iat[row, frame.columns.get_loc(col)] = value
    return frame


@pytest.mark.parametrize("corrupt, column, names_row", [
    pytest.param(lambda f: _set_cell(f, "curve_id", None), "curve_id", True, id="null-curve_id"),
    pytest.param(lambda f: _set_cell(f, "family", None), "family", False, id="null-family"),
    pytest.param(lambda f: _set_cell(f, "task_set", None), "task_set", False, id="null-task_set"),
    pytest.param(lambda f: f.assign(batch_size=f["batch_size"].astype(str)), "batch_size", False,
                 id="batch_size-str"),
    pytest.param(lambda f: f.assign(lr=f["lr"].astype(str)), "lr", False, id="lr-str"),
    pytest.param(lambda f: f.assign(losses=[",".join(map(str, x)) for x in f["losses"]]), "losses", False,
                 id="losses-str"),
    pytest.param(lambda f: f.assign(seed=f["seed"].astype(float) + 0.5), "seed", False, id="seed-float"),
])
def test_bank_with_bad_cells_names_file_column_and_curve(smoke_bank, tmp_path, corrupt, column, names_row):
    good = load_bank(smoke_bank).head(3).reset_index(drop=True)
    bad = corrupt(good.copy())
    path = tmp_path / "bad.parquet"
    bad.to_parquet(path)  # written without validation, as a foreign tool would
    with pytest.raises(BankError) as err:
        load_bank(path)
    msg = str(err.value)
    assert str(path) in msg and repr(column) in msg, msg
    assert ("row 1" in msg) if names_row else (repr(good["curve_id"][1]) in msg or
                                               repr(good["curve_id"][0]) in msg), msg
    with pytest.raises(BankError):  # the same check guards writing
        save_bank(bad, tmp_path / "out.parquet")


def test_other_task_set_labels_are_evaluated(smoke_bank, tmp_path):
    """Any task_set label is allowed: a relabelled OOD set is loaded and gets its own query set."""
    frame = load_bank(smoke_bank)
    frame["task_set"] = frame["task_set"].replace({"rl_ood": "my_rl_set"})
    path = save_bank(frame, tmp_path / "relabelled.parquet")
    loaded = load_bank(path)
    assert (loaded["task_set"] == "my_rl_set").sum() == (frame["task_set"] == "my_rl_set").sum() > 0
    sets = bank_query_sets(loaded, QueryConfig())
    assert set(sets) == set(loaded.loc[loaded["split"] == "test", "task_set"]) == {"id", "my_rl_set", "vit_ood"}
    curves, queries = sets["my_rl_set"]
    assert len(curves) == (frame["task_set"] == "my_rl_set").sum() and len(queries) > 0


@pytest.mark.parametrize("stream, extra, words", [
    ({"horizon": 50, "jobs": [{"kind": "mlp_digits", "seed": 1, "eps": 0.3, "arrival": 60, "window": 9}]}, [],
     "job 0 (mlp_digits): arrival 60 outside [0, horizon 50)"),
    ("not json", [], "not a job stream"),
    (None, ["--method", "mara", "--policy", "/nonexistent/policy"], "/nonexistent/policy"),
    (None, ["--method", "nope"], "unknown method 'nope'"),
])
def test_live_bad_inputs_fail_before_ray_starts(tmp_path, smoke_bank, capsys, mlflow_store, stream, extra, words):
    argv = ["live", "--profile", "smoke", "--bank", str(smoke_bank), "--out", str(tmp_path / "run"), *extra]
    if stream is not None:
        path = tmp_path / "stream.json"
        path.write_text(stream if isinstance(stream, str) else json.dumps(stream))
        argv += ["--stream", str(path)]
    assert words in fail(argv, capsys)
    assert not (tmp_path / "run" / "ticks.jsonl").exists()


def test_live_with_a_dashboard_address_says_how_to_reach_the_cluster(tmp_path, smoke_bank, capsys, mlflow_store,
                                                                     monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8266")
    line = fail(["live", "--profile", "smoke", "--bank", str(smoke_bank), "--method", "edf", "--horizon", "5",
                 "--out", str(tmp_path / "run")], capsys)
    assert "mara submit-live" in line and "dashboard address" in line


def test_live_stream_seed_zero_is_a_seed(smoke_bank):
    args = build_parser().parse_args(["live", "--profile", "smoke", "--bank", str(smoke_bank), "--method", "edf",
                                      "--stream-seed", "0"])
    args.profile = Profile.load("smoke")
    _, _, stream, _, out = planned_live(args)
    assert stream.meta["seed"] == 0 and out.name == "edf-stream0"
