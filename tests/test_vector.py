"""The pooled vector env: M envs in lockstep with one predictor call per step."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import mara_env
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import PooledVectorEnv, replay_in_lockstep
from tests.test_env import random_valid_action


@pytest.mark.parametrize("predictor_name", ["wls", "fm"])
def test_pooled_envs_match_independent_envs(smoke_bank, untrained_fm, predictor_name):
    """Same seeds and actions: identical observations, rewards and autoresets."""
    predictor = untrained_fm if predictor_name == "fm" else predictor_name
    kw = dict(bank=str(smoke_bank), split="test", horizon=60, arrival_prob=0.3, predictor=predictor)
    pooled = PooledVectorEnv(3, **kw)
    single = [MultiNodeEnv(**kw) for _ in range(3)]
    seeds = [int(x) for x in np.random.SeedSequence(10).generate_state(3)]  # what reset(seed=10) spreads
    obs, _ = pooled.reset(seed=10)
    single_obs = [env.reset(seed=s)[0] for s, env in zip(seeds, single, strict=True)]
    rng = np.random.default_rng(0)
    done = np.zeros(3, bool)
    episodes_ended, predictions_seen = 0, set()
    for _ in range(150):
        actions = np.stack([random_valid_action(o, 7, rng) for o in single_obs])
        obs, rewards, terminated, _, _ = pooled.step(actions)
        for i, env in enumerate(single):
            if done[i]:  # next-step autoreset: the action is ignored, the env starts over
                single_obs[i], _ = env.reset()
                reward, term = 0.0, False
            else:
                single_obs[i], reward, term, _, _ = env.step(actions[i])
            for key in single_obs[i]:
                np.testing.assert_allclose(obs[key][i], single_obs[i][key], rtol=1e-5, atol=1e-6)
            assert rewards[i] == pytest.approx(reward, rel=1e-6, abs=1e-9) and terminated[i] == term
            predictions_seen.update(np.round(single_obs[i]["slots"][:, 1], 3).tolist())
        episodes_ended += int(terminated.sum())
        done = terminated
    assert episodes_ended >= 3 and len(predictions_seen) > 10  # autoresets and real predictions covered


def test_runners_seeded_one_apart_replay_no_common_episode(smoke_bank):
    """RLlib seeds env runner w with seed + w: the pooled envs of neighbouring runners (and of
    neighbouring training seeds) must still draw distinct episodes."""
    kw = dict(bank=str(smoke_bank), horizon=200, arrival_prob=0.1)
    episodes = []
    for runner_seed in (1, 2, 1000, 1001):
        pooled = PooledVectorEnv(4, **kw)
        pooled.reset(seed=runner_seed)
        episodes += [json.dumps(env.episode.to_dict(), sort_keys=True) for env in pooled.envs]
    assert len(set(episodes)) == len(episodes) == 16


def test_make_vec_builds_the_pooled_env(smoke_bank):
    venv = gym.make_vec(mara_env.ENV_ID, num_envs=2, vectorization_mode="vector_entry_point",
                        bank=str(smoke_bank), split="test")
    assert isinstance(venv.unwrapped, PooledVectorEnv) and venv.num_envs == 2
    assert venv.envs[0].predictor is venv.envs[1].predictor  # one predictor, one batch per step
    obs, _ = venv.reset(seed=0)
    assert obs["slots"].shape == (2, 16, 4)
    with pytest.raises(TypeError, match="unknown MultiNodeEnv option"):
        PooledVectorEnv(2, bank=str(smoke_bank), n_gpus=1)


def test_rllib_env_creator_pools_when_asked_for_a_vector_env(smoke_bank):
    from mara_rl.train_scheduler import make_env

    env_config = {"bank": str(smoke_bank), "split": "test"}
    assert isinstance(make_env(env_config), MultiNodeEnv)
    assert make_env(env_config | {"num_envs": 3}).num_envs == 3


def test_lockstep_replay_matches_playing_each_episode_alone(smoke_bank):
    from mara_env.registry import ALLOCATORS

    cfg = EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1, strict=True)
    env = MultiNodeEnv(cfg)
    episodes = []
    for seed in range(3):
        env.reset(seed=seed)
        episodes.append(env.episode)
    lara = ALLOCATORS["lara"]()
    together = replay_in_lockstep(cfg, episodes,
                                  lambda obs, envs: np.stack([lara.act(e.scheduler_view()) for e in envs]))
    for episode, out in zip(episodes, together, strict=True):
        env.reset(options={"episode": episode})
        done, total = False, 0.0
        while not done:
            _, reward, done, _, info = env.step(lara.act(env.scheduler_view()))
            total += reward
        assert out["episode_successes"] == info["episode_successes"] and out["shaped_return"] == total
        assert out["utilisation"] == info["utilisation"]
