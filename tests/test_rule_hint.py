"""The rule hint (`EnvConfig.rule_hint`): the observation carries an allocator's joint action,
and the MAT's learned bonus on it makes a residual policy that starts at the rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from ray.rllib.core.columns import Columns

from mara_common.config import ConfigError
from mara_env.cluster import ClusterConfig
from mara_env.env import EnvConfig, MultiNodeEnv, sample_episodes
from mara_env.registry import ALLOCATORS
from mara_rl.mat_module import MATConfig
from mara_rl.policy import act, export_policy, load_policy, module_spec, policy_env

IDENTICAL = ClusterConfig()
CLUSTER = ClusterConfig(node_speeds=(2, 2, 1, 1, 1, 0.5, 0.5), restore_lo=2, restore_hi=10)


def hinted(bank: Path, rule: str, cluster: ClusterConfig = IDENTICAL) -> EnvConfig:
    return EnvConfig(bank=str(bank), split="test", arrival_prob=0.1, optimistic_quantile=0.15,
                     probe_points=12, rule_hint=rule, cluster=cluster)


def play(env: MultiNodeEnv, episode, decide) -> dict:
    obs, _ = env.reset(options={"episode": episode})
    done = False
    while not done:
        obs, _, done, _, _ = env.step(decide(obs, env))
    return env.episode_summary()


@pytest.mark.parametrize("cluster", [IDENTICAL, CLUSTER], ids=["identical", "cluster"])
@pytest.mark.parametrize("rule", ["lara_optimistic", "llf", "admission"])
def test_playing_the_hint_is_playing_the_rule(smoke_bank, rule: str, cluster: ClusterConfig) -> None:
    """An env played by its own hint scores as the rule does in the plain env, step for step."""
    cfg = hinted(smoke_bank, rule, cluster)
    episode = sample_episodes(cfg, 1, seed=5)[0]
    allocator = ALLOCATORS[rule]()
    by_hint = play(MultiNodeEnv(cfg), episode, lambda obs, env: obs["rule_action"])
    plain = dataclasses.replace(cfg, rule_hint=None)
    by_rule = play(MultiNodeEnv(plain), episode, lambda obs, env: allocator.act(env.scheduler_view()))
    assert by_hint == by_rule and by_hint["episode_tasks"] > 0
    assert "rule_action" not in MultiNodeEnv(plain).reset(seed=0)[0]


def test_an_unknown_rule_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="rule_hint: unknown allocator 'coin'"):
        EnvConfig(rule_hint="coin")


@pytest.mark.parametrize("cluster", [IDENTICAL, CLUSTER], ids=["identical", "cluster"])
def test_a_large_rule_bias_acts_as_the_rule_and_a_zero_one_does_not(smoke_bank, cluster: ClusterConfig) -> None:
    """With a large bonus the untrained MAT's greedy choice is the hint at every node of an episode
    (no mask stands in its way); at 0 the hint is only an input, and the MAT leaves it."""
    cfg = hinted(smoke_bank, "lara_optimistic", cluster)
    episode = sample_episodes(cfg, 1, seed=5)[0]
    for bias, follows in ((50.0, True), (0.0, False)):
        torch.manual_seed(0)
        module = module_spec(cfg, MATConfig(rule_bias_init=bias)).build().eval()
        agree = []

        def decide(obs, env, module=module, agree=agree):
            action = act(module, obs)
            agree.append(np.array_equal(action, obs["rule_action"]))
            return action

        play(MultiNodeEnv(cfg), episode, decide)
        assert all(agree) if follows else not all(agree)


def test_the_bonus_keeps_train_and_sampling_logp_equal_and_learns(smoke_bank) -> None:
    cfg = hinted(smoke_bank, "llf", CLUSTER)
    torch.manual_seed(0)
    module = module_spec(cfg, MATConfig(work_conserving=True)).build()
    gen = torch.Generator().manual_seed(0)
    present = torch.rand(64, 16, generator=gen) < 0.4
    any_present = present.any(1, keepdim=True)
    obs = {"slots": torch.rand(64, 16, cfg.slot_features, generator=gen), "globals": torch.rand(64, 4, generator=gen),
           "slot_mask": present.to(torch.int8), "nodes": torch.rand(64, 7, 2, generator=gen),
           "node_last": torch.randint(0, 17, (64, 7), generator=gen) * any_present,
           "rule_action": torch.randint(0, 17, (64, 7), generator=gen) * any_present}
    explored = module.forward_exploration({Columns.OBS: obs})
    trained = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: explored[Columns.ACTIONS]})
    logp = module.get_train_action_dist_cls().from_logits(trained[Columns.ACTION_DIST_INPUTS]).logp(
        explored[Columns.ACTIONS])
    torch.testing.assert_close(logp, explored[Columns.ACTION_LOGP], atol=1e-4, rtol=0)
    (-logp.mean()).backward()
    assert module.rule_bias.grad is not None and module.rule_bias.grad.abs().sum() > 0


def test_an_exported_hinted_policy_runs_with_its_rule(smoke_bank, tmp_path: Path) -> None:
    cfg = hinted(smoke_bank, "llf")
    module = module_spec(cfg, MATConfig(rule_bias_init=2.5)).build()
    policy = export_policy(module, tmp_path / "policy", cfg)
    assert policy_env(policy)["rule_hint"] == "llf"
    loaded = load_policy(policy)
    assert loaded.rule_bias.item() == 2.5
    obs, _ = MultiNodeEnv(cfg).reset(seed=0)
    np.testing.assert_array_equal(act(loaded, obs), act(module.eval(), obs))
