"""Decisions at events (`EnvConfig.decision_interval`): a held joint action is the same action
stepped until the next event, and the shaped return still counts the successes exactly."""

import dataclasses

import numpy as np
import pytest

from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import replay_in_lockstep
from mara_env.workload import WorkloadConfig
from mara_rl.evaluate import frozen_episodes
from mara_rl.methods import classic
from tests.test_env import random_valid_action


def config(smoke_bank, **kw) -> EnvConfig:
    kw = {"bank": str(smoke_bank), "split": "test", "arrival_prob": 0.06, "probe_points": 12, **kw}
    return EnvConfig(**kw)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("interval", [3, 20])
def test_a_held_decision_is_its_action_stepped_until_an_event(smoke_bank, untrained_fm, seed, interval):
    """Twin envs on one episode: the held env takes one decision; the per-step env repeats that
    action step by step until it sees an event or the interval ends. Same state, same
    observation (the forecasts refreshed once for every task served since), same reward."""
    held = MultiNodeEnv(config(smoke_bank, decision_interval=interval, predictor=untrained_fm,
                               optimistic_quantile=0.15))
    step = MultiNodeEnv(dataclasses.replace(held.cfg, decision_interval=None))
    obs, _ = held.reset(seed=seed)
    twin, _ = step.reset(options={"episode": held.episode})
    rng = np.random.default_rng(seed)
    decisions, done, lengths = 0, False, []
    while not done:
        np.testing.assert_array_equal(obs["slots"], twin["slots"])
        action = random_valid_action(obs, held.cfg.n_nodes, rng)
        obs, reward, done, _, info = held.step(action)
        total, steps = 0.0, 0
        while True:
            twin, r, twin_done, _, twin_info = step.step(action)
            total, steps = total + r, steps + 1
            if twin_done or step.event or steps == interval:
                break
        decisions += 1
        lengths.append(steps)
        assert reward == pytest.approx(total, abs=1e-9)
        assert held.t == step.t and done == twin_done
        np.testing.assert_array_equal(held.n_obs, step.n_obs)
        np.testing.assert_array_equal(held.status, step.status)
    assert info["episode_successes"] == twin_info["episode_successes"]
    assert decisions < held.cfg.horizon and max(lengths) == interval  # events did not fire every step


@pytest.mark.parametrize("interval", [1, 5, 50])
def test_shaped_return_equals_successes_when_held(smoke_bank, interval):
    env = MultiNodeEnv(config(smoke_bank, decision_interval=interval, beta=0.5, strict=True))
    rng = np.random.default_rng(interval)
    obs, _ = env.reset(seed=interval)
    total, done, decisions = 0.0, False, 0
    while not done:
        obs, r, done, _, info = env.step(random_valid_action(obs, 7, rng, idle_prob=0.1))
        total, decisions = total + r, decisions + 1
    assert total == pytest.approx(info["episode_successes"], abs=1e-9)
    assert decisions >= env.cfg.horizon / interval
    assert (decisions == env.cfg.horizon) == (interval == 1)


def test_interval_one_is_the_per_step_env(smoke_bank, untrained_fm):
    """decision_interval = 1 and unset decide every step: the same episode, the same outcome."""
    cfg = config(smoke_bank, predictor=untrained_fm, optimistic_quantile=0.15,
                 workload=WorkloadConfig(unreachable_frac=0.1))
    episodes = frozen_episodes(cfg.bank_path, "id", "test", cfg.arrival_prob, 0, 3, cfg.horizon, cfg.workload)
    runs = [replay_in_lockstep(dataclasses.replace(cfg, decision_interval=k), episodes,
                               classic("lara_optimistic")()) for k in (None, 1)]
    assert [r["succeeded"].tolist() for r in runs[0]] == [r["succeeded"].tolist() for r in runs[1]]


def test_held_decisions_shorten_the_episode_the_policy_sees(smoke_bank):
    """One transition per decision: a rule replayed with a 20-step hold takes far fewer."""
    cfg = config(smoke_bank, predictor="wls")
    episodes = frozen_episodes(cfg.bank_path, "id", "test", cfg.arrival_prob, 0, 2, cfg.horizon, cfg.workload)
    counts = {k: [0, 0] for k in (None, 20)}
    for k, seen in counts.items():
        def count(i: int, *_, seen: list[int] = seen) -> None:
            seen[i] += 1

        replay_in_lockstep(dataclasses.replace(cfg, decision_interval=k), episodes, classic("edf")(), on_step=count)
    assert counts[None] == [cfg.horizon] * 2
    assert all(cfg.horizon / 20 <= n < cfg.horizon / 2 for n in counts[20])


def test_a_clone_plays_on_alone(smoke_bank, untrained_fm):
    """`MultiNodeEnv.clone` mid-episode: the copy and the original, given the same actions, stay
    equal; stepping the copy leaves the original where it was."""
    env = MultiNodeEnv(config(smoke_bank, predictor=untrained_fm, optimistic_quantile=0.15, decision_interval=5))
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(20):
        obs, *_ = env.step(random_valid_action(obs, 7, rng))
    copy = env.clone()
    before = (env.t, env.n_obs.copy(), env.stats.copy())
    actions = [random_valid_action(obs, 7, rng) for _ in range(15)]
    stepped = [copy.step(a)[:3] for a in actions]
    assert env.t == before[0] and (env.n_obs == before[1]).all() and env.stats == before[2]
    for action, (c_obs, c_reward, c_done) in zip(actions, stepped, strict=True):
        o, r, done, *_ = env.step(action)
        np.testing.assert_array_equal(o["slots"], c_obs["slots"])
        assert r == c_reward and done == c_done
