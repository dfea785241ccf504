"""The privileged critic: the env shows the value function what only the simulator knows, and
the policy never reads it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from mara_common.config import ConfigError
from mara_env.env import CRITIC_WINDOWS, EnvConfig, MultiNodeEnv
from mara_fm.predictors import OraclePredictor
from mara_rl.mat_module import MATConfig
from mara_rl.policy import export_policy, load_policy, module_spec


def critic_env(smoke_bank, **kw) -> MultiNodeEnv:
    return MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1, critic_features=True,
                                  optimistic_quantile=0.15, probe_points=12, **kw))


def serve_first(obs: dict[str, np.ndarray], n_nodes: int = 7) -> np.ndarray:
    action = np.zeros(n_nodes, np.int64)
    slots = np.flatnonzero(obs["slot_mask"])[:n_nodes]
    action[:len(slots)] = slots + 1
    return action


def test_critic_features_are_the_true_demand_and_the_arrivals_to_come(smoke_bank):
    env = critic_env(smoke_bank)
    oracle = OraclePredictor()
    obs, _ = env.reset(seed=3)
    checked = feasible = infeasible = 0
    for _ in range(120):
        obs, *_ = env.step(serve_first(obs))
        assert env.observation_space.contains(obs)
        present = np.flatnonzero(obs["slot_mask"])
        present = present[env.n_obs[env.slot_task[present]] > 0]  # the oracle answers for served tasks
        tasks = env.slot_task[present]
        seen = env.n_obs[tasks]
        truth = oracle.replay_remaining(env.curves, env.task_rows[tasks], seen, env.eps[tasks],
                                        (env.cap - seen).astype(np.float64))
        np.testing.assert_allclose(obs["critic_slots"][present, 0], np.minimum(truth / env.cap, 1.0), rtol=1e-6)
        reaches = (env.task_avg[tasks] <= env.eps[tasks, None]).any(1)
        expected = reaches & (truth <= env.deadline[tasks] - env.t)
        np.testing.assert_array_equal(obs["critic_slots"][present, 1], expected)
        feasible += int(expected.sum())
        infeasible += int((~expected).sum())
        checked += len(present)
        # The demand arriving in the next W steps, in node-steps of the window.
        ahead = [(env.arrival > env.t) & (env.arrival <= env.t + w) for w in CRITIC_WINDOWS]
        full = np.array([min(env.true_demand[a].sum() / (7 * w), 1.0) for a, w in zip(ahead, CRITIC_WINDOWS,
                                                                                      strict=True)])
        np.testing.assert_allclose(obs["critic_globals"][:len(CRITIC_WINDOWS)], full, rtol=1e-5)
    assert checked > 100 and feasible > 0 and infeasible > 0


def test_critic_features_change_nothing_else(smoke_bank):
    """Same episode, same actions: the same observation (less the critic's part), rewards, outcome."""
    plain = MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1,
                                   optimistic_quantile=0.15, probe_points=12))
    env = critic_env(smoke_bank)
    a, _ = plain.reset(seed=5)
    b, _ = env.reset(seed=5)
    done = False
    while not done:
        assert set(b) - set(a) == {"critic_slots", "critic_globals"}
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
        action = serve_first(a)
        a, ra, done, _, info_a = plain.step(action)
        b, rb, _, _, info_b = env.step(action)
        assert ra == rb
    assert info_a["episode_successes"] == info_b["episode_successes"]


def test_the_policy_never_reads_the_critic_features(smoke_bank, tmp_path):
    """Logits and actions do not move when the privileged features do; the value does. The
    exported policy loads with its critic and acts on observations without those features."""
    cfg = EnvConfig(bank=str(smoke_bank), split="test", critic_features=True)
    torch.manual_seed(0)
    module = module_spec(cfg, MATConfig(work_conserving=True)).build()
    env = MultiNodeEnv(cfg)
    obs, _ = env.reset(seed=1)
    for _ in range(30):
        obs, *_ = env.step(serve_first(obs))
    batch = {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}
    actions = module.forward_inference({Columns.OBS: batch})[Columns.ACTIONS]
    other = {**batch, "critic_slots": torch.rand_like(batch["critic_slots"]),
             "critic_globals": torch.rand_like(batch["critic_globals"])}
    train = {Columns.OBS: batch, Columns.ACTIONS: actions}
    out, out_other = module.forward_train(train), module.forward_train({**train, Columns.OBS: other})
    torch.testing.assert_close(out[Columns.ACTION_DIST_INPUTS], out_other[Columns.ACTION_DIST_INPUTS])
    assert not torch.allclose(module.compute_values({Columns.OBS: batch}), module.compute_values({Columns.OBS: other}))
    loaded = load_policy(export_policy(module, tmp_path / "policy", cfg))
    bare = {k: v for k, v in batch.items() if not k.startswith("critic_")}
    assert torch.equal(loaded.forward_inference({Columns.OBS: bare})[Columns.ACTIONS], actions)


def test_live_runs_refuse_the_critic_features(smoke_bank):
    from mara_live.env import LiveEnv

    with pytest.raises(ConfigError, match="true future"):
        LiveEnv(EnvConfig(bank=str(smoke_bank), critic_features=True), curves=None, trainer=None)
