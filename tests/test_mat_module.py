"""The MAT module's autoregressive policy: exact log-probs, masks, gradients."""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import pytest
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from mara_env.env import make_spaces
from mara_rl.mat_module import MASKED_LOGIT, MATModule

K, N = 16, 7
SLOT_FEATURES, GLOBALS = 4, 4


def spaces(n_nodes: int = N, n_slots: int = K) -> tuple[gym.spaces.Dict, gym.spaces.MultiDiscrete]:
    return make_spaces(n_nodes, n_slots)


def build(seed: int = 0, **model_config: int | bool) -> MATModule:
    torch.manual_seed(seed)
    obs_space, act_space = spaces()
    return RLModuleSpec(module_class=MATModule, observation_space=obs_space,
                        action_space=act_space, model_config=model_config).build()


def random_obs(batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Occupancies cycle through 0, 1, ..., K tasks so edge cases are always covered."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.arange(batch) % (K + 1)
    ranks = torch.rand(batch, K, generator=gen).argsort(1).argsort(1)
    present = ranks < counts[:, None]
    slots = torch.rand(batch, K, SLOT_FEATURES, generator=gen) * present[..., None]
    slots[..., 0] = present.float()
    return {"slots": slots, "globals": torch.rand(batch, GLOBALS, generator=gen),
            "slot_mask": present.to(torch.int8)}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny matrices: extra threads only fight the other jobs on a small machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_valid(actions: torch.Tensor, obs: dict[str, torch.Tensor]) -> None:
    picks = torch.nn.functional.one_hot(actions, K + 1)[..., 1:].sum(1)  # (B, K) times picked
    assert picks.max() <= 1, "a slot was picked by two nodes"
    assert (picks <= obs["slot_mask"].long()).all(), "an empty slot was picked"


@pytest.mark.parametrize("work_conserving", [False, True])
def test_train_logp_equals_sampling_logp(work_conserving: bool) -> None:
    module = build(work_conserving=work_conserving)
    obs = random_obs(256)
    explored = module.forward_exploration({Columns.OBS: obs})
    trained = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: explored[Columns.ACTIONS]})
    dist = module.get_train_action_dist_cls().from_logits(trained[Columns.ACTION_DIST_INPUTS])
    logp = dist.logp(explored[Columns.ACTIONS])
    torch.testing.assert_close(logp, explored[Columns.ACTION_LOGP], atol=1e-4, rtol=0)
    # The stored dist inputs (used for PPO's KL term) describe the same distribution.
    old = module.get_exploration_action_dist_cls().from_logits(explored[Columns.ACTION_DIST_INPUTS])
    torch.testing.assert_close(old.logp(explored[Columns.ACTIONS]), logp, atol=1e-4, rtol=0)
    kl, entropy = old.kl(dist), dist.entropy()
    assert torch.isfinite(kl).all() and kl.abs().max() < 1e-3
    assert torch.isfinite(entropy).all() and (entropy >= 0).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masks_never_allow_duplicates_or_empty_slots(seed: int) -> None:
    module = build(seed)
    with torch.no_grad():  # sharpen the policy so that masks, not luck, do the work
        module.pointer_query.weight.mul_(20.0)
    obs = random_obs(340, seed)
    for _ in range(3):
        assert_valid(module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS], obs)
    assert_valid(module.forward_inference({Columns.OBS: obs})[Columns.ACTIONS], obs)
    # With no tasks at all every node must idle; with fewer tasks than nodes some must.
    actions = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    counts = obs["slot_mask"].sum(1)
    assert (actions[counts == 0] == 0).all()
    assert ((actions > 0).sum(1) <= counts).all()


def test_gradients_reach_every_parameter() -> None:
    module = build()
    obs = random_obs(64)
    actions = module.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS]
    assert (actions == 0).any() and (actions > 0).any()
    out = module.forward_train({Columns.OBS: obs, Columns.ACTIONS: actions})
    dist = module.get_train_action_dist_cls().from_logits(out[Columns.ACTION_DIST_INPUTS])
    values = module.compute_values({Columns.OBS: obs}, embeddings=out[Columns.EMBEDDINGS])
    loss = -dist.logp(actions).mean() - 0.01 * dist.entropy().mean() + values.pow(2).mean()
    loss.backward()
    missing = [name for name, p in module.named_parameters()
               if p.grad is None or not torch.isfinite(p.grad).all() or p.grad.abs().sum() == 0]
    assert not missing, f"no gradient for {missing}"


def test_inference_is_deterministic_and_greedy() -> None:
    module = build()
    obs = random_obs(128, seed=3)
    first = module.forward_inference({Columns.OBS: obs})
    second = module.forward_inference({Columns.OBS: obs})
    assert torch.equal(first[Columns.ACTIONS], second[Columns.ACTIONS])
    logits = first[Columns.ACTION_DIST_INPUTS].view(-1, N, K + 1)
    assert torch.equal(logits.argmax(-1), first[Columns.ACTIONS])
    # Masked entries carry the finite mask value, never -inf.
    assert torch.isfinite(logits).all() and logits.min() >= MASKED_LOGIT * 1.01


def test_model_config_sizes_and_compute_values_shape() -> None:
    module = build(embed_dim=32, n_heads=2, n_blocks=2, ff_dim=48)
    assert module.cfg.embed_dim == 32 and len(module.encoder) == 2
    values = module.compute_values({Columns.OBS: random_obs(5)})
    assert values.shape == (5,)


def test_work_conserving_nodes_idle_only_when_every_task_is_served() -> None:
    module = build(work_conserving=True)
    obs = random_obs(340, seed=4)
    counts = obs["slot_mask"].sum(1)
    for out in (module.forward_exploration({Columns.OBS: obs}), module.forward_inference({Columns.OBS: obs})):
        assert_valid(out[Columns.ACTIONS], obs)
        served = (out[Columns.ACTIONS] > 0).sum(1)
        assert torch.equal(served, torch.minimum(counts, torch.tensor(N)))
    lazy = build()  # without the mask an untrained policy idles beside waiting tasks
    served = (lazy.forward_exploration({Columns.OBS: obs})[Columns.ACTIONS] > 0).sum(1)
    assert (served < torch.minimum(counts, torch.tensor(N))).any()
