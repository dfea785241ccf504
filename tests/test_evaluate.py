import json

import mlflow
import numpy as np
import pytest

from mara_common.config import ConfigError
from mara_common.kernels import machine
from mara_common.paths import EPISODE_DIR
from mara_env.env import EnvConfig, load_curves
from mara_env.workload import load_episodes, true_demand
from mara_fm.bank import bank_digest, load_bank, save_bank
from mara_rl.cli import main
from mara_rl.evaluate import (
    EvalConfig,
    completion_by_slack,
    evaluate,
    evaluate_method,
    frozen_episodes,
    pooled_episodes,
    slack_bands,
)
from mara_rl.methods import MethodSpec, builtin_methods, parse_policies, rule_names


def test_evaluate_cli_writes_results_and_mlflow_runs(smoke_bank, tmp_path, mlflow_store):
    out = tmp_path / "eval"
    main(["evaluate", "--profile", "smoke", "--bank", str(smoke_bank), "--methods",
          "fifo,edf,lara,oracle,fifo", "--task-set", "id", "--load", "0.04", "--out", str(out)])
    records = json.loads((out / "results.json").read_text())
    assert [r["method"] for r in records] == ["fifo", "edf", "lara", "oracle"]  # a repeat runs once
    for r in records:
        assert 0.0 <= r["success_rate_mean"] <= 1.0 and len(r["per_root"]) == 2
    oracle = records[-1]
    assert all(r["success_rate_mean"] <= oracle["success_rate_mean"] + 1e-12 for r in records)
    assert "| lara | id | 0.04 |" in (out / "results.md").read_text()

    mlflow.set_tracking_uri(mlflow_store)
    runs = mlflow.search_runs(experiment_names=["mara-evaluation"])
    (parent,) = runs[runs["tags.kind"] == "evaluation"].itertuples()
    records = runs[runs["tags.kind"] == "record"]
    assert set(records["tags.method"]) == {"fifo", "edf", "lara", "oracle"} and len(records) == 4
    assert (records["tags.mlflow.parentRunId"] == parent.run_id).all()
    assert (records["tags.profile"] == "smoke").all() and records["metrics.success_rate_mean"].notna().all()
    assert "lara · id · p=0.04" in set(records["tags.mlflow.runName"])
    # What they were computed from, as tags: runs from another bank or processor stand out.
    assert (records["tags.input.bank"] == bank_digest(smoke_bank)).all()
    assert (runs["tags.machine.processor"] == machine()["processor"]).all()
    # The results files are stored once, with the evaluation, not with every record.
    client = mlflow.MlflowClient(mlflow_store)
    assert {a.path for a in client.list_artifacts(parent.run_id)} == {"results.json", "results.md", "inputs.json"}
    assert not client.list_artifacts(records["run_id"].iloc[0])
    experiment = client.get_experiment_by_name("mara-evaluation")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def test_evaluate_cli_runs_on_validation_episodes(smoke_bank, tmp_path):
    out = tmp_path / "val"
    main(["evaluate", "--profile", "smoke", "--bank", str(smoke_bank), "--methods", "edf,oracle",
          "--split", "val", "--out", str(out), "--no-mlflow"])
    records = json.loads((out / "results.json").read_text())
    val_eps = load_episodes(next(EPISODE_DIR.glob(f"{smoke_bank.stem}-*/id-val-p0.040-root0.json")))
    assert all(e.meta["split"] == "val" for e in val_eps)
    assert len(records) == 2 and records[0]["success_rate_mean"] <= records[1]["success_rate_mean"] + 1e-12


def test_frozen_episodes_reload_identically(smoke_bank, tmp_path):
    from mara_env.workload import save_episodes

    cfg = EnvConfig()
    first = frozen_episodes(smoke_bank, "id", "test", 0.04, 0, 2, cfg.horizon, cfg.workload)
    again = frozen_episodes(smoke_bank, "id", "test", 0.04, 0, 2, cfg.horizon, cfg.workload)
    copy = save_episodes(first, tmp_path / "copy.json")
    for a, b, c in zip(first, again, load_episodes(copy), strict=True):
        assert a.to_dict() == b.to_dict() == c.to_dict()
    assert any(EPISODE_DIR.glob(f"{smoke_bank.stem}-*/id-test-p0.040-root0.json"))


def test_frozen_episodes_follow_the_banks_content(smoke_bank, tmp_path):
    """A bank rebuilt at the same path with other curves gets its own episodes and thresholds."""
    bank = tmp_path / smoke_bank.name
    frame = load_bank(smoke_bank)
    save_bank(frame, bank)
    cfg = EnvConfig()
    first = frozen_episodes(bank, "id", "test", 0.04, 0, 1, cfg.horizon, cfg.workload)
    frame["losses"] = frame["losses"].map(lambda losses: [x / 2 for x in losses])
    save_bank(frame, bank)
    halved = frozen_episodes(bank, "id", "test", 0.04, 0, 1, cfg.horizon, cfg.workload)
    assert first[0].curve_ids == halved[0].curve_ids
    np.testing.assert_allclose(halved[0].eps, first[0].eps / 2, rtol=0.2)


def test_pooled_episodes_are_the_roots_in_order(smoke_bank):
    cfg = EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.05)
    pooled = pooled_episodes(cfg, roots=2, per_root=2)
    by_root = [e for r in range(2)
               for e in frozen_episodes(smoke_bank, "id", "test", 0.05, r, 2, cfg.horizon, cfg.workload)]
    assert [e.to_dict() for e in pooled] == [e.to_dict() for e in by_root]
    assert len({json.dumps(e.to_dict(), sort_keys=True) for e in pooled}) == 4  # two roots, not one twice


def test_malformed_episode_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"curve_ids\": []}]")
    with pytest.raises(ValueError, match="malformed frozen episode file"):
        load_episodes(bad)


def test_unknown_method_is_a_clear_error(smoke_bank, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--profile", "smoke", "--bank", str(smoke_bank), "--methods", "magic",
              "--out", str(tmp_path), "--no-mlflow"])
    assert "magic (unknown; known:" in capsys.readouterr().err


def test_policies_flag_takes_an_optional_training_seed():
    assert parse_policies("mara=a/policy, mara@2=b/policy,x@10=c") == {
        ("mara", None): "a/policy", ("mara", 2): "b/policy", ("x", 10): "c"}
    for bad in ("mara", "=dir", "mara@=dir", "mara@two=dir"):
        with pytest.raises(ConfigError, match="NAME@SEED=POLICY_DIR"):
            parse_policies(bad)


def test_completion_by_slack_accounts_for_every_success(smoke_bank):
    cfg = EnvConfig(bank=str(smoke_bank), split="test")
    episodes = frozen_episodes(smoke_bank, "id", "test", 0.04, 0, 3, cfg.horizon, cfg.workload)
    out = evaluate_method(builtin_methods(None, {})["edf"], cfg, [episodes])
    curves = load_curves(smoke_bank, "id", "test")
    slack = np.concatenate([(e.deadline - e.arrival) - true_demand(e, curves) for e in episodes])
    successes = sum(rate * len(e) for rate, e in zip(out["per_root"][0], episodes, strict=True))
    counted = 0.0
    for key, lo, hi in slack_bands():
        share, n = out["diagnostics"][key], int(((slack >= lo) & (slack < hi)).sum())
        assert (n == 0 and np.isnan(share)) or 0.0 <= share <= 1.0
        counted += share * n if n else 0.0
    assert counted == pytest.approx(successes)  # every success is a feasible task in exactly one band
    assert successes > 0

    flags = [np.zeros(len(e), bool) for e in episodes]
    infeasible = np.flatnonzero(slack < 0)
    assert len(infeasible), "the smoke workload has infeasible tasks"
    sizes = np.cumsum([0, *map(len, episodes)])
    ep = int(np.searchsorted(sizes, infeasible[0], side="right") - 1)
    flags[ep][infeasible[0] - sizes[ep]] = True
    with pytest.raises(AssertionError, match="beyond its own dedicated-node bound"):
        completion_by_slack(episodes, flags, curves)


def test_a_training_load_range_leaves_the_evaluation_alone(smoke_bank):
    """Frozen episodes carry their own load, so an env whose range stops below a swept load
    evaluates it, and as an env without the range does."""
    methods = [builtin_methods(None, {})["edf"]]
    eval_cfg = EvalConfig(roots=1, episodes_per_root=2, workers=1)
    plain, ranged = (evaluate(methods, ["id"], [0.08], smoke_bank, EnvConfig(bank=str(smoke_bank), **kw),
                              eval_cfg, log_mlflow=False, progress=False)
                     for kw in ({}, {"arrival_prob_max": 0.05}))
    assert ranged[0].per_episode == plain[0].per_episode and ranged[0].load == 0.08


@pytest.mark.parametrize("bad", [{"kind": "baseline"}, {"view": "all"}, {"predictor": "fm:/x"}])
def test_a_registry_entry_is_checked(bad):
    with pytest.raises(ValueError, match="method 'x'"):
        MethodSpec(**{"name": "x", "allocator": "edf", "predictor": "wls", **bad})


def test_history_methods_run_from_the_cli_and_are_not_rules(smoke_bank, tmp_path, capsys):
    """`--history` enables the methods that read earlier runs of each task's kind; they are
    reported beside the rules, never counted among them."""
    out, pool = tmp_path / "eval", tmp_path / "history.parquet"
    save_bank(load_bank(smoke_bank), pool)  # a wiring check: any bank with every family will do
    names = "lara_history_optimistic,llf_history,oracle"
    with pytest.raises(SystemExit):
        main(["evaluate", "--profile", "smoke", "--bank", str(smoke_bank), "--methods", names,
              "--task-set", "id", "--load", "0.04", "--out", str(out), "--no-mlflow"])
    assert "llf_history (needs a history bank" in capsys.readouterr().err
    main(["evaluate", "--profile", "smoke", "--bank", str(smoke_bank), "--methods", names, "--history", str(pool),
          "--task-set", "id,rl_ood", "--load", "0.04", "--out", str(out), "--no-mlflow"])
    records = json.loads((out / "results.json").read_text())
    assert {(r["method"], r["task_set"]) for r in records} == {(m, t) for m in names.split(",")
                                                               for t in ("id", "rl_ood")}
    bound = {r["task_set"]: r["success_rate_mean"] for r in records if r["method"] == "oracle"}
    assert all(r["success_rate_mean"] <= bound[r["task_set"]] + 1e-12 for r in records)
    assert not {"lara_history_optimistic", "llf_history"} & set(rule_names())
