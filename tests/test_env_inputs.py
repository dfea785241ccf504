"""Inputs the simulator must refuse clearly (configs, actions) or handle (episodes without tasks)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mara_common.config import ConfigError, make_config
from mara_env.env import EnvConfig, MultiNodeEnv, load_curves
from mara_env.registry import ALLOCATORS
from mara_env.vector import replay_in_lockstep
from mara_env.workload import (
    BurstConfig,
    Episode,
    WorkloadConfig,
    add_burst,
    oracle_successes,
    sample_episode,
)

# --------------------------------------------------------------------------- episodes without tasks


def env_for(smoke_bank, **kw) -> MultiNodeEnv:
    return MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", optimistic_quantile=0.15, strict=True, **kw))


def play(env: MultiNodeEnv, allocator, **reset) -> tuple[dict, float, int]:
    """(last info, shaped return, steps) of one episode played by `allocator`."""
    env.reset(**reset)
    done, total, steps = False, 0.0, 0
    while not done:
        _, reward, done, _, info = env.step(allocator.act(env.scheduler_view()))
        total += reward
        steps += 1
    return info, total, steps


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
def test_allocators_play_an_episode_without_arrivals(smoke_bank, name):
    """arrival_prob 0: no task ever arrives; every allocator idles to the horizon."""
    env = env_for(smoke_bank, arrival_prob=0.0, horizon=40)
    info, total, steps = play(env, ALLOCATORS[name](), seed=0)
    assert steps == 40 and total == 0.0
    assert info["episode_tasks"] == 0 and info["episode_successes"] == 0
    assert info["success_rate"] == 0.0  # defined (0) when there is nothing to succeed at
    assert info["utilisation"] == 0.0 and info["episode_invalid_actions"] == 0
    view = env.scheduler_view()
    assert not view.present.any() and view.arrival.dtype.kind == "i" and view.predicted.dtype.kind == "f"


@pytest.mark.parametrize("name", sorted(ALLOCATORS))
@pytest.mark.parametrize("horizon", [1, 2, 5])
def test_allocators_play_tiny_horizons(smoke_bank, name, horizon):
    """A horizon of a few steps: most episodes have no task, some one or two; all run to the end
    and the shaped return is the number of successes."""
    env = env_for(smoke_bank, arrival_prob=0.2, horizon=horizon)
    sizes = set()
    for seed in range(12):
        info, total, steps = play(env, ALLOCATORS[name](), seed=seed)
        sizes.add(info["episode_tasks"])
        assert steps == horizon and total == pytest.approx(info["episode_successes"], abs=1e-9)
        m = info["episode_tasks"]
        assert info["success_rate"] == (info["episode_successes"] / m if m else 0.0)
    assert 0 in sizes


def test_frozen_empty_episode_replays_and_has_a_zero_oracle_bound(smoke_bank):
    env = env_for(smoke_bank, horizon=5)
    empty = Episode([], [], [], [], 5, {})
    assert oracle_successes(empty, env.curves) == 0
    info, total, steps = play(env, ALLOCATORS["llf"](), options={"episode": empty})
    assert (steps, total, info["episode_tasks"], info["success_rate"]) == (5, 0.0, 0, 0.0)
    # Sampling itself yields the same kind of episode.
    episode = sample_episode(env.curves, 5, 0.0, WorkloadConfig(), np.random.default_rng(0))
    assert len(episode) == 0 and episode.arrival.dtype == np.int64 and episode.window.dtype == np.int64


def test_lockstep_replay_mixes_empty_and_busy_episodes(smoke_bank):
    cfg = EnvConfig(bank=str(smoke_bank), split="test", horizon=30, arrival_prob=0.3, strict=True)
    busy = sample_episode(load_curves(smoke_bank, "id", "test"), 30, 0.3, cfg.workload, np.random.default_rng(1))
    assert len(busy) > 0
    lara = ALLOCATORS["lara"]()
    out = replay_in_lockstep(cfg, [Episode([], [], [], [], 30, {}), busy],
                             lambda obs, envs: np.stack([lara.act(e.scheduler_view()) for e in envs]))
    assert out[0]["episode_tasks"] == 0 and out[0]["success_rate"] == 0.0 and out[0]["shaped_return"] == 0.0
    assert out[1]["episode_tasks"] == len(busy)
    assert out[1]["shaped_return"] == pytest.approx(out[1]["episode_successes"], abs=1e-9)


def test_bursts_in_a_short_horizon_keep_only_tasks_that_arrive_in_it(smoke_bank):
    """A burst is placed so that it fits the horizon; where the horizon is too short for it,
    the tasks that would arrive at or after the horizon are left out (they could never be
    served yet would count as tasks)."""
    curves = load_curves(smoke_bank, "id", "test")
    for seed in range(5):
        rng = np.random.default_rng(seed)
        episode = add_burst(Episode([], [], [], [], 8, {}), curves, BurstConfig(), rng)
        assert len(episode) == len(episode.arrival) == len(episode.eps) == len(episode.window)
        assert (episode.arrival < 8).all() and np.all(np.diff(episode.arrival) >= 0)
    env = env_for(smoke_bank, horizon=8, burst_prob=1.0, arrival_prob=0.0)
    info, total, _ = play(env, ALLOCATORS["edf"](), seed=0)
    assert info["episode_tasks"] == len(env.episode) and total == pytest.approx(info["episode_successes"])


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("overrides, field", [
    ({"n_nodes": True}, "n_nodes"),
    ({"n_slots": 2.0}, "n_slots"),
    ({"n_nodes": 0}, "n_nodes"),
    ({"queue_size": -1}, "queue_size"),
    ({"horizon": 0}, "horizon"),
    ({"horizon": False}, "horizon"),
    ({"beta": float("nan")}, "beta"),
    ({"beta": float("inf")}, "beta"),
    ({"beta": -0.1}, "beta"),
    ({"beta": True}, "beta"),
    ({"arrival_prob": float("nan")}, "arrival_prob"),
    ({"arrival_prob": 1.5}, "arrival_prob"),
    ({"arrival_prob": "0.1"}, "arrival_prob"),
    ({"burst_prob": -0.5}, "burst_prob"),
    ({"arrival_prob_max": 1.5}, "arrival_prob_max"),
    ({"arrival_prob": 0.05, "arrival_prob_max": 0.04}, "arrival_prob_max"),
    ({"strict": 1}, "strict"),
    ({"split": "validation"}, "split"),
    ({"optimistic_quantile": 0.7}, "optimistic_quantile"),
    ({"optimistic_quantile": float("nan")}, "optimistic_quantile"),
    ({"probe_points": 2}, "probe_points"),
    ({"probe_points": 12.5}, "probe_points"),
    ({"workload": "default"}, "workload"),
])
def test_env_config_rejects_bad_values_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"EnvConfig\.{field}\b"):
        EnvConfig(**overrides)


def test_env_config_accepts_valid_values_unchanged():
    cfg = EnvConfig(n_nodes=np.int64(3), n_slots=5, queue_size=0, horizon=1, arrival_prob=0, beta=0,
                    burst_prob=1, optimistic_quantile=0.0, probe_points=4,
                    workload={"target_lo": 10, "target_hi": 10}, burst={"doomed": [0, 2]})
    assert cfg.workload == WorkloadConfig(target_lo=10, target_hi=10)
    assert cfg.burst.doomed == (0, 2) and cfg.n_nodes == 3
    assert EnvConfig(**dataclasses.asdict(EnvConfig())) == EnvConfig()  # a config's own values pass


@pytest.mark.parametrize("cls, values", [
    (EnvConfig, {"n_nodes": np.int64(3), "arrival_prob": 0, "beta": np.float32(0.5), "strict": np.True_}),
    (EnvConfig, {"workload": {"window_lo": 1, "unreachable_margin": [0.5, 0.9]}, "burst": {"delay": [1, 2]}}),
    (WorkloadConfig, {"unreachable_margin": [0.5, 0.9], "eps_jitter": 0}),
    (BurstConfig, {"doomed": [np.int32(1), 2]}),
])
def test_direct_construction_and_make_config_check_alike(cls, values):
    """One set of rules: built from keyword arguments or by `make_config`, a config holds the
    same values of the same types (ints given for floats become floats, numpy numbers Python's,
    lists tuples, tables nested configs)."""
    direct, made = cls(**values), make_config(cls, values)
    assert direct == made
    for a, b in zip(dataclasses.astuple(direct), dataclasses.astuple(made), strict=True):
        assert type(a) is type(b)
    for f in dataclasses.fields(direct):
        value = getattr(direct, f.name)
        if isinstance(value, float | int) and not isinstance(value, bool):
            assert type(value) is type(getattr(cls(), f.name))
    assert dataclasses.replace(direct) == direct


@pytest.mark.parametrize("cls, values, words", [
    (EnvConfig, {"n_nodes": 7.0}, "EnvConfig.n_nodes must be an integer"),
    (EnvConfig, {"beta": float("nan")}, "EnvConfig.beta must be a finite number"),
    (EnvConfig, {"burst": {"short": [True, 3]}}, "BurstConfig.short[0] must be an integer"),
    (EnvConfig, {"workload": {"target_lo": "a"}}, "WorkloadConfig.target_lo must be an integer"),
    (EnvConfig, {"burst": {"doomd": [0, 1]}}, "unknown key(s) ['doomd'] for BurstConfig"),
    (WorkloadConfig, {"unreachable_margin": [0.5, 0.6, 0.7]}, "WorkloadConfig.unreachable_margin must be a list of 2"),
])
def test_direct_construction_and_make_config_refuse_alike(cls, values, words):
    with pytest.raises(ConfigError) as direct:
        cls(**values)
    with pytest.raises(ConfigError) as made:
        make_config(cls, values, where="profile.toml [env]")
    assert words in str(direct.value) and words in str(made.value)
    assert str(made.value).startswith("profile.toml [env]: ")


@pytest.mark.parametrize("overrides, field", [
    ({"target_lo": 300, "target_hi": 200}, "target_lo"),
    ({"target_lo": 0}, "target_lo"),
    ({"target_hi": 12.5}, "target_hi"),
    ({"threshold_source": "median"}, "threshold_source"),
    ({"unreachable_frac": 1.2}, "unreachable_frac"),
    ({"unreachable_frac": float("nan")}, "unreachable_frac"),
    ({"unreachable_margin": (0.95, 0.7)}, "unreachable_margin"),
    ({"unreachable_margin": (0.0, 0.5)}, "unreachable_margin"),
    ({"unreachable_margin": (0.5, 1.5)}, "unreachable_margin"),
    ({"unreachable_margin": (0.5,)}, "unreachable_margin"),
    ({"eps_quantile": -0.1}, "eps_quantile"),
    ({"eps_jitter": -0.01}, "eps_jitter"),
    ({"window_lo": 0.0}, "window_lo"),
    ({"window_lo": 2.0, "window_hi": 1.5}, "window_lo"),
    ({"window_hi": float("inf")}, "window_hi"),
    ({"min_window": 0}, "min_window"),
    ({"window_basis": "deadline"}, "window_basis"),
    ({"fit_horizon": "yes"}, "fit_horizon"),
])
def test_workload_config_rejects_bad_values_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"WorkloadConfig\.{field}\b"):
        WorkloadConfig(**overrides)


@pytest.mark.parametrize("overrides, field", [
    ({"doomed": (7, 3)}, "doomed"),
    ({"doomed": (-1, 3)}, "doomed"),
    ({"short": (True, 3)}, "short"),
    ({"short_demand": (0, 40)}, "short_demand"),
    ({"short_demand": (15.5, 40)}, "short_demand"),
    ({"doomed_window": (60, 110, 120)}, "doomed_window"),
    ({"delay": 3}, "delay"),
    ({"slack": (-5, 30)}, "slack"),
    ({"doomed_window": (10, 20), "delay": (3, 20), "slack": (0, 5)}, "doomed_window"),  # short windows < 1
])
def test_burst_config_rejects_bad_values_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"BurstConfig\.{field}\b"):
        BurstConfig(**overrides)
    with pytest.raises(ConfigError, match=rf"BurstConfig\.{field}\b"):
        EnvConfig(burst={k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()})


# --------------------------------------------------------------------------- actions


def busy_env(smoke_bank, **kw) -> tuple[MultiNodeEnv, np.ndarray]:
    """An env after three idle steps with one arrival per step: four occupied slots."""
    env = MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=1.0, **kw))
    return env, prime(env)


def prime(env: MultiNodeEnv) -> np.ndarray:
    env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(np.zeros(7, np.int64))
    occupied = np.flatnonzero(obs["slot_mask"])
    assert len(occupied) == 4
    return occupied


@pytest.mark.parametrize("action", [
    np.array([0.5, 1.2, 0, 0, 0, 0, 0]),
    np.array([1.0, 2.0, 0, 0, 0, 0, 0]),  # integral values, but not an integer array
    np.zeros(7),
    np.array([True, False, False, False, False, False, False]),
    [0.5, 1, 0, 0, 0, 0, 0],
    np.array(["1", "0", "0", "0", "0", "0", "0"]),
])
def test_non_integer_actions_are_refused(smoke_bank, action):
    env, _ = busy_env(smoke_bank)
    with pytest.raises(ValueError, match=r"7 integers in \[0, 16\]"):
        env.step(action)


@pytest.mark.parametrize("action", [np.zeros(6, np.int64), np.zeros(8, np.int64), [], np.zeros((2, 7), np.int64)])
def test_actions_of_the_wrong_shape_are_refused(smoke_bank, action):
    env, _ = busy_env(smoke_bank)
    with pytest.raises(ValueError, match=r"7 integers in \[0, 16\].*shape"):
        env.step(action)


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("bad", [-1, 17, 1000])
def test_out_of_range_actions_are_refused_even_when_not_strict(smoke_bank, strict, bad):
    env, _ = busy_env(smoke_bank, strict=strict)
    action = np.zeros(7, np.int64)
    action[3] = bad
    with pytest.raises(ValueError, match=rf"7 integers in \[0, 16\].*node 3.*{bad}"):
        env.step(action)


def test_integer_actions_of_every_form_act_alike(smoke_bank):
    """int64 / int32 / uint8 arrays, lists of ints and a (1, N) batch row are one and the same action."""
    env, occupied = busy_env(smoke_bank)
    picks = [int(s) + 1 for s in occupied[:3]] + [0, 0, 0, 0]
    forms = [np.array(picks, np.int64), np.array(picks, np.int32), np.array(picks, np.uint8), picks,
             np.array([picks], np.int64), [np.int64(p) for p in picks]]
    outcomes = []
    for form in forms:
        prime(env)
        obs, reward, _, _, info = env.step(form)
        outcomes.append((reward, info["busy_nodes"], info["invalid_actions"], obs["slots"].tobytes()))
    assert all(o == outcomes[0] for o in outcomes) and outcomes[0][1] == 3 and outcomes[0][2] == 0


def test_invalid_picks_in_range_still_idle_the_node(smoke_bank):
    """Empty or already taken slots keep their rule: the node idles (strict: ValueError)."""
    env, occupied = busy_env(smoke_bank, n_slots=16)
    empty = np.flatnonzero(env.observation()["slot_mask"] == 0)
    action = np.zeros(7, np.int64)
    action[:3] = [occupied[0] + 1, occupied[0] + 1, empty[0] + 1]
    _, _, _, _, info = env.step(action)
    assert info["invalid_actions"] == 2 and info["busy_nodes"] == 1
