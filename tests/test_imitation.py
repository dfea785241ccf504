"""The imitation warm start: demonstrations from an allocator, and a MAT fitted to them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mara_env.env import EnvConfig, sample_episodes
from mara_env.vector import replay_in_lockstep
from mara_rl.evaluate import classic
from mara_rl.imitation import demonstrations, imitate, score
from mara_rl.mat_module import MATConfig
from mara_rl.train_scheduler import module_spec


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
    with pytest.raises(ValueError, match="unknown imitation teacher"):
        demonstrations(env_cfg, "lottery", 1, seed=0)


def test_imitation_makes_the_mat_act_like_its_teacher(env_cfg: EnvConfig) -> None:
    demos = demonstrations(env_cfg, "lara", 4, seed=0)
    torch.manual_seed(0)
    module = module_spec(env_cfg, MATConfig(work_conserving=True)).build()
    before = score(module, demos)
    imitate(module, demos, epochs=10, lr=1e-3, seed=0)
    after = score(module, demos)
    assert after["nll"] < 0.5 * before["nll"]
    assert after["node_agreement"] > before["node_agreement"] + 0.4
    assert after["value_mse"] < before["value_mse"]
