"""The cluster options: node speeds, restore costs, the bound, the peers and the MAT's node tokens."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from mara_common.config import ConfigError
from mara_common.paths import PROFILE_DIR
from mara_common.profile import Profile
from mara_env.cluster import ClusterConfig, node_batches, steps_alone
from mara_env.env import EnvConfig, MultiNodeEnv, make_spaces, sample_episodes
from mara_env.peers import DeadlineAdmission, fit_optimus, optimus_remaining
from mara_env.registry import ALLOCATORS
from mara_env.workload import Episode, oracle_successes
from mara_rl.evaluate import EvalConfig, evaluate_method
from mara_rl.mat_module import MATModule
from mara_rl.methods import builtin_methods
from mara_rl.report import ReportConfig
from mara_rl.scheduler_config import SchedulerConfig
from mara_rl.timeline import plot, record

CLUSTER = ClusterConfig(node_speeds=(2, 2, 1, 1, 1, 0.5, 0.5), restore_lo=2, restore_hi=10)


def cluster_env(smoke_bank, cluster: ClusterConfig = CLUSTER, **kw) -> MultiNodeEnv:
    return MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", optimistic_quantile=0.15, strict=True,
                                  cluster=cluster, **kw))


def one_task(env: MultiNodeEnv, demand_row: int = 0) -> Episode:
    """An episode of one task arriving at step 0, with a window of 250 steps and a threshold
    below anything its first 20 points reach."""
    cid = env.curves.ids[demand_row]
    eps = float(env.curves.avg[demand_row, :20].min()) * 0.5
    return Episode([cid], np.array([0]), np.array([eps]), np.array([250]), env.cfg.horizon, {})


def test_node_clock_and_steps_alone() -> None:
    speeds = np.array([2.0, 1.0, 0.5])
    served = sum(node_batches(speeds, t) for t in range(10))
    assert served.tolist() == [20, 10, 5]
    assert node_batches(speeds, 0).tolist() == [2, 1, 0] and node_batches(speeds, 1).tolist() == [2, 1, 1]
    # Alone on a node: the least number of steps that serves the demand, from the arrival on.
    def served_in(steps: int, arrival: int, speed: float) -> int:
        return sum(int(node_batches(np.array([speed]), t)[0]) for t in range(arrival, arrival + steps))

    for speed in (0.5, 1.0, 2.0):
        for arrival in (0, 3):
            for demand in (1, 7, 20):
                s = int(steps_alone(np.array([demand]), np.array([arrival]), speed)[0])
                assert served_in(s, arrival, speed) >= demand > served_in(s - 1, arrival, speed)


def test_config_refuses_bad_speeds_and_ranges() -> None:
    with pytest.raises(ConfigError, match="multiples of 0.5"):
        ClusterConfig(node_speeds=(1, 0.3))
    with pytest.raises(ConfigError, match="restore_lo"):
        ClusterConfig(restore_lo=5, restore_hi=2)
    with pytest.raises(ConfigError, match="3 entries for 7 nodes"):
        ClusterConfig(node_speeds=(1, 1, 2)).speeds(7)


def test_defaults_leave_the_paper_setting_alone(smoke_bank) -> None:
    paper = EnvConfig(bank=str(smoke_bank), optimistic_quantile=0.15)
    assert not paper.cluster.enabled and paper.node_features == 0
    obs, _ = MultiNodeEnv(paper).reset(seed=0)
    assert set(obs) == {"slots", "globals", "slot_mask"} and obs["slots"].shape[1] == 5
    obs, _ = cluster_env(smoke_bank).reset(seed=0)
    assert obs["slots"].shape[1] == 8 and obs["nodes"].shape == (7, 2) and obs["node_last"].shape == (7,)
    assert cluster_env(smoke_bank).observation_space.contains(obs)


def test_fast_node_reveals_two_points_and_a_move_costs_the_restore(smoke_bank) -> None:
    env = cluster_env(smoke_bank)
    env.reset(options={"episode": one_task(env)})
    r = int(env.restore_cost[0])
    assert 2 <= r <= 10
    serve = lambda node: env.step(np.array([1 if i == node else 0 for i in range(7)]))  # noqa: E731
    serve(0)  # first service: no restore, two batches on a fast node
    assert env.n_obs[0] == 2
    serve(0)  # the same node again: no restore
    assert env.n_obs[0] == 4
    for _ in range(r):  # moved to node 2: r steps without progress, the node counts as busy
        _, _, _, _, info = serve(2)
        assert env.n_obs[0] == 4 and info["busy_nodes"] == 1
    obs, *_ = serve(2)
    assert env.n_obs[0] == 5 and obs["node_last"][2] == 1 and obs["nodes"][2, 1] == 0
    env.step(np.zeros(7, np.int64))  # a pause, then the same node: a restore again
    obs, *_ = serve(2)
    assert env.n_obs[0] == 5 and obs["slots"][0, -2] == pytest.approx((r - 1) / 10)
    assert obs["slots"][0, -1] == 0.5  # held by node 2, of speed 1 (the fastest: 2)


@pytest.mark.parametrize("cluster", [CLUSTER, ClusterConfig(node_speeds=(0.5,) * 7, restore_hi=3),
                                     ClusterConfig(restore_lo=1, restore_hi=20)])
@pytest.mark.parametrize("seed", [0, 1])
def test_shaped_return_counts_successes_exactly(smoke_bank, cluster: ClusterConfig, seed: int) -> None:
    """Random (valid) joint actions, so tasks move, pause and restore all the time."""
    env = cluster_env(smoke_bank, cluster, beta=0.7, arrival_prob=0.1)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    done, total = False, 0.0
    while not done:
        present = np.flatnonzero(obs["slot_mask"])
        picks = rng.permutation(present)[:7] + 1
        action = np.zeros(7, np.int64)
        action[rng.permutation(7)[:len(picks)]] = picks
        obs, reward, done, _, info = env.step(action)
        total += reward
    assert total == pytest.approx(info["episode_successes"], abs=1e-9)


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_bound_holds_for_every_allocator_on_the_cluster(smoke_bank, name: str) -> None:
    env = cluster_env(smoke_bank, arrival_prob=0.1)
    allocator = ALLOCATORS[name]()
    for seed in range(2):
        env.reset(seed=seed)
        done = False
        while not done:
            *_, done, _, info = env.step(allocator.act(env.scheduler_view()))
        assert info["episode_successes"] <= oracle_successes(env.episode, env.curves, 2.0)
    assert oracle_successes(env.episode, env.curves, 2.0) >= oracle_successes(env.episode, env.curves, 1.0)


def test_aware_teacher_moves_a_running_task_only_to_a_faster_node(smoke_bank) -> None:
    env = cluster_env(smoke_bank, arrival_prob=0.1)
    env.reset(seed=0)
    teacher, kept, moves = ALLOCATORS["lara_optimistic"](), 0, 0
    for _ in range(300):
        view = env.scheduler_view()
        action = teacher.act(view)
        for node, slot in enumerate(view.node_slot):
            if slot >= 0 and slot + 1 in action:  # a task still served: same node, or a faster one
                now = int(np.flatnonzero(action == slot + 1)[0])
                kept += now == node
                moves += now != node
                assert now == node or view.speeds[now] > view.speeds[node]
        env.step(action)
    assert kept > 10 * max(moves, 1)


def test_optimus_fit_recovers_its_model() -> None:
    k = np.arange(1, 61)
    losses = 1.0 / (0.05 * k + 1.0) + 0.3
    beta0, beta1, beta2 = fit_optimus(losses)
    assert beta0 == pytest.approx(0.05, rel=0.05) and beta2 == pytest.approx(0.3, rel=0.05)
    assert optimus_remaining(losses, 0.5) == pytest.approx(21.0, abs=1.5)
    assert optimus_remaining(losses, 0.29) == np.inf  # below the fitted floor: never


def test_admission_refuses_what_would_break_an_admitted_deadline(smoke_bank) -> None:
    env = cluster_env(smoke_bank, ClusterConfig(), arrival_prob=0.0)
    env.reset(seed=0)
    view = env.scheduler_view()
    k = 3
    present = np.zeros(16, bool)
    present[:k] = True
    view = view.__class__(t=0, present=present, arrival=np.zeros(16, np.int64), deadline=np.full(16, 10),
                          observed=np.full(16, 5), predicted=np.full(16, 10.0), n_nodes=1,
                          task=np.arange(16), env_key=(1, 1), speeds=np.ones(1))
    admission = DeadlineAdmission()
    assert admission.act(view).tolist() == [1]  # one fits on one node by step 10; the rest wait
    assert admission.admitted[(1, 1)] == {0} and admission.refused[(1, 1)] == {1, 2}


def test_mat_node_tokens_keep_train_and_sampling_logp_equal() -> None:
    obs_space, act_space = make_spaces(7, 16, 8, 2)
    torch.manual_seed(0)
    module = RLModuleSpec(module_class=MATModule, observation_space=obs_space, action_space=act_space,
                          model_config={"work_conserving": True}).build()
    gen = torch.Generator().manual_seed(0)
    present = torch.rand(64, 16, generator=gen) < 0.4
    obs = {"slots": torch.rand(64, 16, 8, generator=gen), "globals": torch.rand(64, 4, generator=gen),
           "slot_mask": present.to(torch.int8), "nodes": torch.rand(64, 7, 2, generator=gen),
           "node_last": torch.randint(0, 17, (64, 7), generator=gen) * present.any(1, keepdim=True)}
    explored = module.forward_exploration({Columns.OBS: obs})
    trained = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: explored[Columns.ACTIONS]})
    logp = module.get_train_action_dist_cls().from_logits(trained[Columns.ACTION_DIST_INPUTS]).logp(
        explored[Columns.ACTIONS])
    torch.testing.assert_close(logp, explored[Columns.ACTION_LOGP], atol=1e-4, rtol=0)
    served = (explored[Columns.ACTIONS] > 0).sum(1)
    assert torch.equal(served, torch.minimum(present.sum(1), torch.tensor(7)))  # still work-conserving
    (-logp.mean()).backward()
    for name in ("keep_bias", "node_embed.weight"):
        grad = module.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_timeline_records_each_nodes_task_and_restores(smoke_bank, tmp_path) -> None:
    cfg = EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1, cluster=CLUSTER)
    episode = sample_episodes(cfg, 1, seed=3)[0]
    methods = builtin_methods(None, {})
    timelines = {name: record(methods[name], cfg, episode) for name in ("edf", "las")}
    # A method deciding at events still gets one row per step.
    held = dataclasses.replace(methods["edf"], name="edf_held", view={"decision_interval": 20})
    timelines["edf_held"] = record(held, cfg, episode)
    for tl in timelines.values():
        assert tl.served.shape == (cfg.horizon, 7) and tl.speeds.tolist() == list(CLUSTER.node_speeds)
        busy = tl.served[tl.served >= 0]
        assert len(busy) and not (tl.restoring & (tl.served < 0)).any()
        for row in tl.served:  # no task on two nodes at once
            assert len(set(row[row >= 0].tolist())) == (row >= 0).sum()
    # EDF moves tasks between nodes in node order, so it pays restores; LAS keeps them in place.
    assert timelines["edf"].restoring.sum() > timelines["las"].restoring.sum() > 0
    path = plot(timelines, tmp_path / "timeline.png")
    assert path.stat().st_size > 10_000


def test_a_profile_can_share_another_profiles_stage_one(tmp_path) -> None:
    shared = Profile.load("cluster")
    default = Profile.load("default")
    assert shared.paths.bank == default.paths.bank and shared.paths.predictor == default.paths.predictor
    assert shared.paths.report != default.paths.report  # its own evaluation and report
    assert shared.values("bank") == default.values("bank")
    assert shared.section(EnvConfig, "env").cluster.enabled
    assert shared.section(EvalConfig, "evaluation").variants == ("mara",)
    assert shared.section(ReportConfig, "report").target_margin_rule == 0.03  # the cluster profile's target
    assert default.section(ReportConfig, "report") == ReportConfig()
    own_bank = tmp_path / "own.toml"
    own_bank.write_text('extends = "default"\n[bank]\nseed = 1\n')
    with pytest.raises(ConfigError, match=r"takes \[bank\] and \[predictor\] from 'default'"):
        Profile.load(own_bank)
    with pytest.raises(ConfigError, match="variants"):
        EvalConfig(variants=("mara", "no_such_variant"))


def test_a_profile_that_extends_another_writes_down_only_what_differs(tmp_path) -> None:
    """Sections come from the base key by key (tables merged); chains and loops are refused."""
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{PROFILE_DIR / "smoke.toml"}"\n[scheduler]\niterations = 3\n'
                     '[scheduler.mat]\nwork_conserving = false\n')
    profile, smoke = Profile.load(child), Profile.load("smoke")
    assert profile.values("scheduler") == {**smoke.values("scheduler"), "iterations": 3,
                                           "mat": {**smoke.values("scheduler")["mat"], "work_conserving": False}}
    assert profile.values("env") == smoke.values("env") and profile.values("bank") == smoke.values("bank")
    assert profile.paths.bank == smoke.paths.bank and profile.paths.report != smoke.paths.report
    grandchild = tmp_path / "grandchild.toml"
    grandchild.write_text(f'extends = "{child}"\n')
    with pytest.raises(ConfigError, match="which itself extends"):
        Profile.load(grandchild)
    (tmp_path / "a.toml").write_text(f'extends = "{tmp_path / "b.toml"}"\n')
    (tmp_path / "b.toml").write_text(f'extends = "{tmp_path / "a.toml"}"\n')
    with pytest.raises(ConfigError, match="in a loop"):
        Profile.load(tmp_path / "a.toml")


def test_a_profile_that_extends_another_can_unset_an_inherited_key(tmp_path) -> None:
    """`unset` drops an inherited key, so its field takes the dataclass default; a key the base
    does not set, a stage-one key, a malformed list and `unset` without a base are refused."""
    smoke = Profile.load("smoke").values("scheduler")
    assert smoke["iterations"] != SchedulerConfig().iterations and "work_conserving" in smoke["mat"]
    child = tmp_path / "child.toml"
    child.write_text(f'extends = "{PROFILE_DIR / "smoke.toml"}"\n'
                     'unset = ["scheduler.iterations", "scheduler.mat.work_conserving"]\n')
    profile = Profile.load(child)
    values = profile.values("scheduler")
    assert "iterations" not in values and "work_conserving" not in values["mat"]
    assert {k: v for k, v in values.items() if k != "mat"} == {k: v for k, v in smoke.items()
                                                               if k not in ("mat", "iterations")}
    assert profile.section(SchedulerConfig, "scheduler").iterations == SchedulerConfig().iterations
    assert Profile.load("smoke").values("scheduler") == smoke  # the base profile is left as it was
    for unset, message in [('["scheduler.no_such_key"]', "does not set it"),
                           ('["no_such_section.beta"]', r"has no \[no_such_section\]"),
                           ('["bank.seed"]', "outside"), ('["iterations"]', "outside"),
                           ('"scheduler.iterations"', "should list")]:
        child.write_text(f'extends = "{PROFILE_DIR / "smoke.toml"}"\nunset = {unset}\n')
        with pytest.raises(ConfigError, match=message):
            Profile.load(child)
    lone = tmp_path / "lone.toml"
    lone.write_text('unset = ["scheduler.iterations"]\n')
    with pytest.raises(ConfigError, match="add extends"):
        Profile.load(lone)


def test_evaluation_on_the_cluster_counts_slack_on_the_fastest_node(smoke_bank) -> None:
    """A task too long for a speed-1 node can succeed on a fast one: the completion bands and
    the bound read slack on the fastest node, and the evaluation accepts such successes."""
    cfg = EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.03, cluster=CLUSTER)
    episodes = [sample_episodes(cfg, 2, seed=5)]  # LAS finishes two tasks a speed-1 node could not
    method = builtin_methods(None, {})["las"]
    result = evaluate_method(method, cfg, episodes)
    bound = evaluate_method(builtin_methods(None, {})["oracle"], cfg, episodes)
    assert cfg.fastest == 2.0
    assert all(0 <= r <= b for r, b in zip(result["per_root"][0], bound["per_root"][0], strict=True))
