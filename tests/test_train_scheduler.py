"""A tiny PPO run end to end: metrics, checkpoint, resume, exported policy."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns

from mara_common.config import ConfigError
from mara_common.flags import flag_name, overrides, to_argv
from mara_common.paths import PROJECT_ROOT
from mara_common.profile import Profile
from mara_env.cluster import ClusterConfig
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_rl.anchored_ppo import ANCHOR_KL
from mara_rl.evaluate import EvalConfig, evaluate
from mara_rl.imitation import demonstrations
from mara_rl.mat_module import MATConfig, MATModule
from mara_rl.methods import VARIANTS, learned
from mara_rl.pipeline import variant_config
from mara_rl.policy import act, export_policy, load_policy, module_spec, policy_digest, policy_env
from mara_rl.run_state import STATE_FILE, load_state, run_inputs, settings_changed, warm_start_dir
from mara_rl.scheduler_commands import add_train_arguments
from mara_rl.scheduler_config import (
    SchedulerConfig,
    default_out,
    run_name,
    scheduler_config,
    training_env,
)
from mara_rl.train_scheduler import EXPERIMENT, build_algorithm, selection_key, train, warm_start

SMOKE = Profile.load("smoke")


def smoke_config(**overrides: object) -> SchedulerConfig:
    """The smoke profile's scheduler settings, on WLS unless told otherwise (no FM needed)."""
    return SMOKE.section(SchedulerConfig, "scheduler", **{"predictor": "wls", **overrides})




def test_train_checkpoint_resume_export(smoke_bank: Path, mlflow_store: str, tmp_path: Path, ray_local: None,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = smoke_config(train_batch_size=200, minibatch_size=100, eval_episodes=2, imitation_episodes=1,
                       imitation_epochs=1, imitation_dagger_rounds=1, imitation_dagger_epochs=1)
    env_cfg = EnvConfig(bank=str(smoke_bank), horizon=100, arrival_prob=0.2)
    out = tmp_path / "run"

    policy = train(cfg, env_cfg, out, run_name="tiny")
    assert (out / "checkpoint" / "rllib_checkpoint.json").exists()
    client = mlflow.MlflowClient(mlflow_store)
    (run,) = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    for key in ("success_rate", "shaped_return", "policy_loss", "vf_loss", "entropy", "env_steps_per_s"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    # Validation also scores the warm-started policy before PPO (step 0), a candidate for export.
    for key in ("val_success_rate", "val_stress_complete"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [0, 1, 2], key
    assert run.data.params["scheduler.gamma"] == "1.0"
    assert "imitation_node_agreement" in run.data.metrics  # the warm start ran before PPO
    assert 0 <= run.data.metrics["imitation_dagger1_node_agreement_on_policy"] <= 1  # and its DAgger round
    # The exported policy is the best validated one: it has that evaluation's scores.
    best = load_state(out)["best"]
    stress, success = ({m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
                       for key in ("val_stress_complete", "val_success_rate"))
    vals = {step: (stress[step], success[step]) for step in stress}
    assert vals[best["iteration"]] == (best["stress_complete"], best["success_rate"])
    assert selection_key(best) == max(vals.values())
    kept = out / f"best_policy-{best['iteration']}"
    assert [p.name for p in out.glob("best_policy-*")] == [kept.name]
    assert (policy / "policy.pt").read_bytes() == (kept / "policy.pt").read_bytes()
    # An export that never finished the validation stress episode says so.
    warned = "no validated policy finished every feasible task" in capsys.readouterr().err
    assert warned == (not best["stress_complete"])

    # A crash inside the checkpoint swap (the new one written beside, the old one set aside)
    # leaves a folder that resumes from the last committed iteration.
    (out / "checkpoint").rename(out / "checkpoint.old")
    (out / "checkpoint.tmp").mkdir()
    assert load_state(out)["iteration"] == 2 and (out / "checkpoint" / STATE_FILE).exists()
    # Resume: the same run folder continues to the new total, in the same MLflow run.
    train(dataclasses.replace(cfg, iterations=3), env_cfg, out)
    (again,) = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    assert again.info.run_id == run.info.run_id
    assert again.data.tags["input.bank"] == run_inputs(env_cfg)["bank"] and "machine.processor" in again.data.tags
    assert [m.step for m in client.get_metric_history(run.info.run_id, "policy_loss")] == [1, 2, 3]
    # Run again when finished: nothing is trained or exported again (each export logs its
    # validation scores once), nothing is logged.
    exports = len(client.get_metric_history(run.info.run_id, "exported_val_success_rate"))
    assert exports == 2  # the first run's and the resumed run's
    assert train(dataclasses.replace(cfg, iterations=3), env_cfg, out) == policy
    assert len(client.get_metric_history(run.info.run_id, "exported_val_success_rate")) == exports
    assert [m.step for m in client.get_metric_history(run.info.run_id, "policy_loss")] == [1, 2, 3]
    with pytest.raises(ConfigError, match="other settings .*scheduler.lr"):
        train(dataclasses.replace(cfg, iterations=4, lr=1e-3), env_cfg, out)
    # A predictor whose files changed since the run began (retrained in place) is refused too.
    state_file = out / "checkpoint" / STATE_FILE
    stored = json.loads(state_file.read_text())
    for name in ("predictor", "bank"):  # so is a bank rebuilt with other curves at the same path
        state_file.write_text(json.dumps({**stored, "inputs": {**stored["inputs"], name: "0" * 16}}))
        with pytest.raises(ConfigError, match=f"content of its {name}"):
            train(dataclasses.replace(cfg, iterations=4), env_cfg, out)
    # A setting added to the code since the run counts as unchanged while at its default.
    added = {**stored, "config": {k: v for k, v in stored["config"].items() if k != "env.workload.fit_horizon"}}
    assert len(added["config"]) == len(stored["config"]) - 1
    state_file.write_text(json.dumps(added))
    assert settings_changed(load_state(out), cfg, env_cfg, run_inputs(env_cfg)) == []
    changed = dataclasses.replace(env_cfg, workload=dataclasses.replace(env_cfg.workload, fit_horizon=False))
    assert settings_changed(load_state(out), cfg, changed, run_inputs(env_cfg)) == ["env.workload.fit_horizon"]
    state_file.write_text(json.dumps(stored))
    # --fresh deletes a run folder, never a folder holding anything else.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds more than a scheduler run"):
        train(cfg, env_cfg, tmp_path / "notes", fresh=True)
    assert (tmp_path / "notes" / "keep.txt").exists()

    # Resumed under another MLflow store (a job logging elsewhere), training goes on in a new run
    # there that names the one it continues.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    policy = train(dataclasses.replace(cfg, iterations=4), env_cfg, out)
    (moved,) = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    assert moved.info.run_id != run.info.run_id and moved.data.tags["resumed_from_run"] == run.info.run_id
    # The new run carries the settings too, as they are now (the store it came from keeps the first).
    assert moved.data.params["scheduler.iterations"] == "4" and moved.data.params["env.n_nodes"] == str(env_cfg.n_nodes)
    assert [m.step for m in mlflow.MlflowClient(other).get_metric_history(moved.info.run_id, "policy_loss")] == [4]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)

    module = load_policy(policy)
    env = MultiNodeEnv(dataclasses.replace(env_cfg, split="test", strict=True))
    obs, _ = env.reset(seed=7)
    terminated = False
    while not terminated:
        action = act(module, obs)
        assert action.shape == (env_cfg.n_nodes,) and action.dtype.kind == "i"
        assert np.array_equal(action, act(module, obs))  # greedy: deterministic
        obs, _, terminated, _, info = env.step(action)
    assert info["episode_invalid_actions"] == 0

    # The exported policy is an evaluation method, run with the predictor it was trained with.
    method = learned("mara_wls", policy)
    assert method.predictor == env_cfg.predictor
    (record,) = evaluate([method], ["id"], [0.2], smoke_bank, env_cfg,
                         EvalConfig(roots=1, episodes_per_root=1), log_mlflow=False, progress=False)
    assert record.method == "mara_wls" and 0.0 <= record.success_rate_mean <= 1.0
    with pytest.raises(FileNotFoundError, match="policy file missing"):
        load_policy(tmp_path / "nowhere")


def test_a_checkpoint_without_its_state_is_refused(tmp_path: Path) -> None:
    (tmp_path / "checkpoint").mkdir()
    with pytest.raises(ConfigError, match="--fresh"):
        load_state(tmp_path)
    (tmp_path / "checkpoint").rmdir()
    (tmp_path / STATE_FILE).write_text("{}")  # the older layout, state beside the checkpoint
    with pytest.raises(ConfigError, match="--fresh"):
        load_state(tmp_path)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return parser.parse_args(list(argv))


def test_flags_come_from_the_config_and_name_the_run_folder() -> None:
    # Every scalar setting has a flag; unset flags keep the profile's value.
    args = parse("--beta", "0", "--imitation-episodes", "32", "--no-pool-predictions")
    assert overrides(args, SchedulerConfig) == {"beta": 0.0, "imitation_episodes": 32, "pool_predictions": False}
    assert to_argv(overrides(args, SchedulerConfig)) == ["--beta", "0.0", "--imitation-episodes", "32",
                                                         "--no-pool-predictions"]
    # The folder names the profile, the labelled settings that differ from it, and the seed.
    assert run_name(SMOKE, scheduler_config(SMOKE)) == "smoke-seed0"
    cfg = scheduler_config(SMOKE, **overrides(parse("--predictor", "wls", "--seed", "2"), SchedulerConfig))
    assert run_name(SMOKE, cfg) == "smoke-wls-seed2"
    cfg = scheduler_config(SMOKE, imitation_teacher="lara", imitation_dagger_rounds=2, beta=0.0)
    assert run_name(SMOKE, cfg) == "smoke-beta0-lara-dagger2-seed0"
    # The policy's trend features and the privileged critic reach the env it trains in.
    cfg = scheduler_config(SMOKE, trend_window=8, critic="privileged")
    assert run_name(SMOKE, cfg) == "smoke-trend8-privileged-seed0"
    env = training_env(cfg, SMOKE, SMOKE.paths.bank)
    assert env.trend_window == 8 and env.critic_features and not training_env(
        scheduler_config(SMOKE), SMOKE, SMOKE.paths.bank).critic_features
    cfg = scheduler_config(SMOKE, rule_hint="llf")
    assert run_name(SMOKE, cfg) == "smoke-hintllf-seed0"
    assert training_env(cfg, SMOKE, SMOKE.paths.bank).rule_hint == "llf"
    with pytest.raises(ConfigError, match="rule_hint must be one of"):
        scheduler_config(SMOKE, rule_hint="coin")
    # The history predictor trains on the profile's history bank (built on first use); a profile
    # without one is refused by name.
    cfg = scheduler_config(SMOKE, predictor="history")
    assert run_name(SMOKE, cfg) == "smoke-history-seed0"
    assert cfg.predictor_spec() == f"history:{SMOKE.paths.history_bank.resolve()}" and cfg.fm_path == ""
    with pytest.raises(ConfigError, match="'paper' has no \\[history_bank\\]"):
        scheduler_config(Profile.load("paper"), predictor="history")
    with pytest.raises(SystemExit):  # argparse names the choices
        parse("--imitation-teacher", "coin")
    with pytest.raises(ConfigError, match="imitation_teacher must be one of"):
        scheduler_config(SMOKE, imitation_teacher="coin")
    with pytest.raises(ConfigError, match="imitation_dagger_rounds must be >= 0"):
        scheduler_config(SMOKE, imitation_dagger_rounds=-1)
    # DAgger continues imitation: without imitation there is none (IMITATION=0 alone works).
    assert scheduler_config(SMOKE, imitation_episodes=0, imitation_dagger_rounds=1).imitation_dagger_rounds == 0
    for bad in ({"beta": float("nan")}, {"iterations": -1}, {"lr": 0.0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            scheduler_config(SMOKE, **bad)


def test_a_run_trained_by_the_command_is_the_pipelines_run(monkeypatch) -> None:
    """`make train-scheduler` (with or without a predictor path, relative or absolute) and
    `make reproduce` build the same settings for the same variant, so one reuses the other's run."""
    monkeypatch.chdir(PROJECT_ROOT)
    relative = SMOKE.paths.predictor.relative_to(PROJECT_ROOT)
    for variant in VARIANTS:
        pipeline_cfg = variant_config(SMOKE, variant, seed=0)
        argv = [x for k, v in variant.settings.items() for x in (flag_name(k), str(v))]
        for extra in ([], ["--fm-path", str(relative)], ["--fm-path", str(SMOKE.paths.predictor)]):
            cli_cfg = scheduler_config(SMOKE, **overrides(parse(*argv, *extra), SchedulerConfig))
            assert cli_cfg == pipeline_cfg, (variant.name, extra)
            assert default_out(SMOKE, cli_cfg) == default_out(SMOKE, pipeline_cfg)
    assert variant_config(SMOKE, VARIANTS[1], 0).fm_path == ""  # a WLS run records no FM path


def test_policy_refuses_a_predictor_changed_since_training(untrained_fm, tmp_path: Path) -> None:
    fm_dir = untrained_fm.export(tmp_path / "fm")
    spec = f"fm:{fm_dir}"
    env_cfg = EnvConfig(predictor=spec)
    policy = export_policy(module_spec(env_cfg, MATConfig()).build(), tmp_path / "policy", env_cfg)
    assert policy_env(policy) == {"predictor": spec, "optimistic_quantile": None, "probe_points": None,
                                  "decision_interval": None, "trend_window": None,
                                  "rule_hint": None, "cluster": dataclasses.asdict(ClusterConfig())}
    config = fm_dir / "config.json"
    config.write_text(config.read_text() + "\n")  # any change to the predictor's files
    with pytest.raises(ConfigError, match="has changed since this policy was trained"):
        policy_env(policy)


def test_a_policy_digest_follows_the_weights_not_the_file(tmp_path: Path) -> None:
    """Two exports of the same weights under other names share a digest; one changed weight does not."""
    env_cfg = EnvConfig(predictor="wls")
    module = module_spec(env_cfg, MATConfig()).build()
    first = policy_digest(export_policy(module, tmp_path / "a", env_cfg))
    assert policy_digest(export_policy(module, tmp_path / "b" / "policy", env_cfg)) == first
    with torch.no_grad():
        next(module.parameters()).view(-1)[0] += 1e-6
    assert policy_digest(export_policy(module, tmp_path / "c", env_cfg)) != first
    with pytest.raises(FileNotFoundError, match="exported policy file missing"):
        policy_digest(tmp_path / "none")


def test_policy_keeps_the_observation_layout_it_was_trained_with(smoke_bank: Path, tmp_path: Path) -> None:
    """A policy trained on the optimistic-forecast and probe observation (6 slot features)
    exports that layout, reloads with it, and acts on that env's observations."""
    env_cfg = EnvConfig(predictor="wls", optimistic_quantile=0.15, probe_points=12, bank=str(smoke_bank))
    trained = module_spec(env_cfg, MATConfig()).build()
    policy = export_policy(trained, tmp_path / "policy", env_cfg)
    assert policy_env(policy) == {"predictor": "wls", "optimistic_quantile": 0.15, "probe_points": 12,
                                  "decision_interval": None, "trend_window": None,
                                  "rule_hint": None, "cluster": dataclasses.asdict(ClusterConfig())}
    loaded = load_policy(policy)
    assert loaded.slot_embed[0].in_features == 6
    obs, _ = MultiNodeEnv(env_cfg).reset(seed=0)
    assert obs["slots"].shape == (env_cfg.n_slots, 6)
    np.testing.assert_array_equal(act(loaded, obs), act(trained.eval(), obs))


def test_warm_start_loads_the_imitated_policy_into_learner_and_env_runners(
        smoke_bank: Path, ray_local: None, tmp_path: Path) -> None:
    cfg = smoke_config(num_env_runners=1, imitation_episodes=1, imitation_epochs=3)
    env_cfg = EnvConfig(bank=str(smoke_bank), horizon=100, arrival_prob=0.2)
    algo = build_algorithm(cfg, env_cfg)
    try:
        module = module_spec(env_cfg, cfg.mat).build()
        metrics = warm_start(algo, module, cfg, env_cfg, tmp_path)
        assert metrics["imitation_node_agreement"] > metrics["imitation_node_agreement_before"]
        expected = {k: v.numpy() for k, v in module.state_dict().items()}
        exported = load_policy(warm_start_dir(tmp_path)).state_dict()
        for key, value in exported.items():  # the anchor's reference is the imitated policy
            np.testing.assert_allclose(value.numpy(), expected[key], err_msg=key)
        learner = algo.learner_group.get_weights([DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID]
        runners = algo.env_runner_group.foreach_env_runner(lambda r: r.module.get_state(), local_env_runner=False)
        assert len(runners) == 1
        for state in (learner, *runners):
            assert state.keys() <= expected.keys() and "slot_embed.0.weight" in state
            for key, value in state.items():
                np.testing.assert_allclose(np.asarray(value), expected[key], err_msg=key)
    finally:
        algo.stop()


def _kl_to(module: MATModule, reference: MATModule, obs: dict[str, torch.Tensor], actions: torch.Tensor) -> float:
    """Mean over states of Σ_nodes KL(reference ‖ module), on the reference's teacher-forced pass."""
    def log_probs(m: MATModule) -> torch.Tensor:
        logits = m.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})[Columns.ACTION_DIST_INPUTS]
        return torch.log_softmax(logits.view(len(actions), m.n_nodes, -1), -1)

    with torch.no_grad():
        ref = log_probs(reference)
        return float((ref.exp() * (ref - log_probs(module))).sum((-1, -2)).mean())


def test_anchor_holds_ppo_near_the_warm_started_policy(smoke_bank: Path, ray_local: None,
                                                       tmp_path: Path) -> None:
    """The same PPO iterations from the same warm start move the policy less with the KL anchor."""
    env_cfg = EnvConfig(bank=str(smoke_bank), horizon=100, arrival_prob=0.2)
    demos = demonstrations(env_cfg, "lara", episodes=2, seed=7)
    distance, reported = {}, {}
    for coeff in (0.0, 30.0):
        cfg = smoke_config(imitation_episodes=2, imitation_epochs=5, imitation_teacher="lara",
                           anchor_coeff=coeff, lr=3e-3, num_epochs=4)
        out = tmp_path / f"anchor{coeff:g}"
        torch.manual_seed(0)
        algo = build_algorithm(cfg, env_cfg, out)
        try:
            warm_start(algo, module_spec(env_cfg, cfg.mat).build(), cfg, env_cfg, out)
            for _ in range(3):
                result = algo.train()
            reported[coeff] = result["learners"][DEFAULT_MODULE_ID].get(ANCHOR_KL)
            trained = module_spec(env_cfg, cfg.mat).build()
            trained.set_state(algo.learner_group.get_weights([DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID])
        finally:
            algo.stop()
        distance[coeff] = _kl_to(trained, load_policy(warm_start_dir(out)), demos.obs, demos.actions)
    assert reported[0.0] is None and reported[30.0] is not None and np.isfinite(reported[30.0])
    assert distance[30.0] < 0.5 * distance[0.0], distance


def test_anchor_needs_a_warm_start() -> None:
    with pytest.raises(ConfigError, match="needs imitation_episodes > 0"):
        SchedulerConfig(anchor_coeff=0.5, imitation_episodes=0)


def test_ppo_at_events_with_the_privileged_critic_exports_a_policy_of_observations_only(
        smoke_bank: Path, mlflow_store: str, ray_local: None, tmp_path: Path) -> None:
    """Held decisions, the privileged critic and `llf` as teacher together (docs/experiments.md,
    "Both together"), at toy sizes: PPO trains, and the exported policy holds its actions
    between events and plays on observations without the critic's features."""
    cfg = smoke_config(decision_interval=5, critic="privileged", imitation_teacher="llf", iterations=1,
                       train_batch_size=200, minibatch_size=100, eval_episodes=2, imitation_episodes=1,
                       imitation_epochs=1, imitation_dagger_rounds=1, imitation_dagger_epochs=1)
    env_cfg = dataclasses.replace(training_env(cfg, SMOKE, smoke_bank), horizon=100, arrival_prob=0.2)
    policy = train(cfg, env_cfg, tmp_path / "run")
    (run,) = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list")
    assert np.isfinite(run.data.metrics["vf_loss"]) and "imitation_node_agreement" in run.data.metrics
    assert policy_env(policy)["decision_interval"] == 5
    method = learned("mara_at_events", policy)
    (record,) = evaluate([method], ["id"], [0.2], smoke_bank, dataclasses.replace(env_cfg, critic_features=False),
                         EvalConfig(roots=1, episodes_per_root=2), log_mlflow=False, progress=False)
    assert len(record.per_episode) == 2 and record.diagnostics  # it played both episodes to their end
