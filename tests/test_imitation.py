"""The imitation warm start: demonstrations from an allocator, and a MAT fitted to them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from mara_env.env import EnvConfig, sample_episodes
from mara_env.vector import replay_in_lockstep
from mara_rl.imitation import demonstrations, imitate, score
from mara_rl.mat_module import MATConfig
from mara_rl.methods import classic
from mara_rl.policy import module_spec


@pytest.fixture(scope="module")
def env_cfg(smoke_bank: Path) -> EnvConfig:
    return EnvConfig(bank=str(smoke_bank), horizon=100, arrival_prob=0.2, burst_prob=0.5)


def test_demonstrations_hold_every_step_and_its_return_to_go(env_cfg: EnvConfig) -> None:
    demos = demonstrations(env_cfg, "lara", 3, seed=5)
    assert len(demos) == 3 * env_cfg.horizon
    assert demos.actions.shape == (len(demos), env_cfg.n_nodes)
    assert all(len(v) == len(demos) for v in demos.obs.values())
    # The return-to-go at each episode's first step is that episode's shaped return.
    finals = replay_in_lockstep(env_cfg, sample_episodes(env_cfg, 3, seed=5), classic("lara")())
    starts = demos.returns[:: env_cfg.horizon]
    assert starts.tolist() == pytest.approx([f["shaped_return"] for f in finals], abs=1e-4)
    with pytest.raises(ValueError, match="unknown imitation teacher 'lottery'"):
        demonstrations(env_cfg, "lottery", 1, seed=0)


def test_dagger_rows_are_the_drivers_states_with_the_teachers_actions(env_cfg: EnvConfig) -> None:
    """With a driver, the episodes are the driver's (its observations and returns) and the
    actions are the teacher's choices in those states; the teacher driving itself is plain
    behaviour cloning."""
    fifo = demonstrations(env_cfg, "fifo", 2, seed=3)
    dagger = demonstrations(env_cfg, "lara", 2, seed=3, driver=classic("fifo")())
    assert all(torch.equal(dagger.obs[k], fifo.obs[k]) for k in fifo.obs)
    assert torch.equal(dagger.returns, fifo.returns)
    assert not torch.equal(dagger.actions, fifo.actions)
    lara = demonstrations(env_cfg, "lara", 2, seed=3)
    assert not torch.equal(dagger.obs["slots"], lara.obs["slots"])  # LARA's own states differ
    itself = demonstrations(env_cfg, "lara", 2, seed=3, driver=classic("lara")())
    assert torch.equal(itself.actions, lara.actions) and torch.equal(itself.returns, lara.returns)
    both = lara + dagger
    assert len(both) == len(lara) + len(dagger) and torch.equal(both.actions[len(lara):], dagger.actions)


def test_imitation_makes_the_mat_act_like_its_teacher(env_cfg: EnvConfig) -> None:
    demos = demonstrations(env_cfg, "lara", 4, seed=0)
    torch.manual_seed(0)
    module = module_spec(env_cfg, MATConfig(work_conserving=True)).build()
    before = score(module, demos)
    imitate(module, demos, epochs=20, lr=1e-3, seed=0)
    after = score(module, demos)
    assert after["nll"] < 0.5 * before["nll"]
    assert after["node_agreement"] > before["node_agreement"] + 0.4
    assert after["value_mse"] < before["value_mse"]


def test_privileged_teacher_plays_lara_on_true_demand_whatever_the_env_forecasts(
        env_cfg: EnvConfig) -> None:
    episodes = sample_episodes(env_cfg, 3, seed=2)
    in_oracle_env: list[list] = [[] for _ in episodes]
    replay_in_lockstep(replace(env_cfg, predictor="oracle"), episodes, classic("lara")(),
                       on_step=lambda i, obs, action, reward: in_oracle_env[i].append((obs, action)))
    steps = [step for episode in in_oracle_env for step in episode]
    demos = demonstrations(env_cfg, "lara_oracle", 3, seed=2)  # env_cfg forecasts with WLS
    assert torch.equal(demos.actions, torch.as_tensor(np.stack([a for _, a in steps])))
    assert not torch.equal(demos.actions, demonstrations(env_cfg, "lara", 3, seed=2).actions)
    # The student sees the run's own forecasts (WLS here), never the true demand.
    oracle_forecasts = np.stack([o["slots"][:, 1] for o, _ in steps])
    assert not np.allclose(demos.obs["slots"][:, :, 1].numpy(), oracle_forecasts)
