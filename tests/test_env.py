import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import mara_env
from mara_env.env import EnvConfig, MultiNodeEnv, load_curves
from mara_env.workload import WorkloadConfig, sample_episode, slack, true_demand


def make(smoke_bank, **kw):
    kw.setdefault("split", "test")
    return gym.make(mara_env.ENV_ID, bank=str(smoke_bank), **kw)


def random_valid_action(obs, n_nodes, rng, idle_prob=0.2):
    slots = list(rng.permutation(np.flatnonzero(obs["slot_mask"])))
    action = np.zeros(n_nodes, np.int64)
    for i in range(n_nodes):
        if slots and rng.random() > idle_prob:
            action[i] = slots.pop() + 1
    return action


def test_gymnasium_check_env(smoke_bank):
    check_env(make(smoke_bank).unwrapped, skip_render_check=True)


def test_make_accepts_config_overrides(smoke_bank):
    env = make(smoke_bank, n_nodes=3, n_slots=5, queue_size=2, horizon=50, arrival_prob=0.2,
               task_set="rl_ood", predictor="oracle", beta=0.0, strict=True)
    assert env.action_space.nvec.tolist() == [6, 6, 6]
    assert env.observation_space["slots"].shape == (5, 4)
    with pytest.raises(TypeError, match="n_gpus"):
        make(smoke_bank, n_gpus=3)
    with pytest.raises(ValueError, match="arrival_prob"):
        make(smoke_bank, arrival_prob=1.5)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("load, beta, bursts", [(0.04, 0.1, 0.0), (0.07, 0.1, 0.0), (0.05, 1.0, 0.5),
                                                (0.06, 0.0, 0.0)])
def test_shaped_return_equals_successes(smoke_bank, seed, load, beta, bursts):
    """docs/design.md §4: Φ_0 = Φ_T = 0, so Σ r_t = #successes for every policy and episode."""
    env = make(smoke_bank, arrival_prob=load, beta=beta, strict=True, burst_prob=bursts)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    total, done, dense = 0.0, False, False
    while not done:
        obs, r, done, _, info = env.step(random_valid_action(obs, 7, rng, idle_prob=rng.random()))
        total += r
        dense |= abs(r - round(r)) > 1e-9
    assert total == pytest.approx(info["episode_successes"], abs=1e-9)
    assert info["success_rate"] == pytest.approx(info["episode_successes"] / info["episode_tasks"])
    if beta > 0 and info["episode_successes"] > 0:
        assert dense  # the shaping really is dense


def test_invalid_picks_idle_by_default_and_raise_when_strict(smoke_bank):
    env = make(smoke_bank, arrival_prob=1.0)
    obs, _ = env.reset(seed=0)
    occupied = np.flatnonzero(obs["slot_mask"])
    empty = np.flatnonzero(obs["slot_mask"] == 0)
    action = np.zeros(7, np.int64)
    action[0] = occupied[0] + 1
    action[1] = occupied[0] + 1  # duplicate of node 0's slot
    action[2] = empty[0] + 1  # empty slot
    _, _, _, _, info = env.step(action)
    assert info["invalid_actions"] == 2 and info["busy_nodes"] == 1

    strict = make(smoke_bank, arrival_prob=1.0, strict=True)
    strict.reset(seed=0)
    with pytest.raises(ValueError, match=rf"node 1 picked slot {occupied[0]}.*already taken"):
        strict.step(action)
    strict.reset(seed=0)
    action[1] = 0
    with pytest.raises(ValueError, match=rf"node 2 picked slot {empty[0]}.*empty"):
        strict.step(action)


def test_same_seed_same_episode_and_rewards(smoke_bank):
    def rollout(seed):
        env = make(smoke_bank)
        rng = np.random.default_rng(0)
        obs, _ = env.reset(seed=seed)
        rewards, done = [], False
        while not done:
            obs, r, done, _, _ = env.step(random_valid_action(obs, 7, rng))
            rewards.append(r)
        return rewards

    assert rollout(3) == rollout(3)
    assert rollout(3) != rollout(4)


def test_step_order_queue_and_rejection(smoke_bank):
    """Arrivals fill free slots, then the queue, then are rejected; nothing outlives T."""
    env = make(smoke_bank, n_slots=2, queue_size=1, horizon=60, arrival_prob=0.9)
    obs, info = env.reset(seed=1)
    rejected, full_seen = info["rejections"], False
    done = False
    while not done:
        obs, _, done, _, info = env.step(np.zeros(7, np.int64))  # always idle
        rejected += info["rejections"]
        full_seen |= info["full_queue"]
        assert obs["slot_mask"].sum() <= 2 and info["waiting"] <= 1
    assert rejected > 0 and full_seen
    assert info["episode_successes"] == 0 and info["utilisation"] == 0.0
    base: MultiNodeEnv = env.unwrapped
    assert not (base.slot_task >= 0).any() and not base.queue


def test_observation_features_are_normalised(smoke_bank):
    env = make(smoke_bank, arrival_prob=0.2)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    for _ in range(100):
        obs, *_ = env.step(random_valid_action(obs, 7, rng))
        assert env.observation_space.contains(obs)
        present = obs["slot_mask"].astype(bool)
        assert np.all(obs["slots"][present, 0] == 1) and np.all(obs["slots"][~present] == 0)


def test_optimistic_feature_shows_the_predictors_low_estimate(smoke_bank, untrained_fm):
    """With `optimistic_quantile` each slot gains a 5th feature, FM's low sample, at or below
    the median estimate; allocators read both. Without it the observation is docs/design.md's."""
    env = MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1,
                                 predictor=untrained_fm, optimistic_quantile=0.15))
    assert MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test")).observation_space["slots"].shape == (16, 4)
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    lower = never = 0
    for _ in range(60):
        obs, *_ = env.step(random_valid_action(obs, 7, rng, idle_prob=0.0))
        assert obs["slots"].shape == (16, 5) and env.observation_space.contains(obs)
        present = obs["slot_mask"].astype(bool)
        view = env.scheduler_view()
        finite = present & np.isfinite(view.optimistic)
        assert np.all(obs["slots"][finite, 4] <= obs["slots"][finite, 1] + 1e-6)
        # A task no sample brings to its threshold within its cap shows 1, above its median's
        # rest-of-cap: the two cases docs/design.md's estimate reports alike stay apart.
        hopeless = present & ~np.isfinite(view.optimistic)
        assert np.all(obs["slots"][hopeless, 4] == 1.0) and np.all(obs["slots"][hopeless, 1] < 1.0)
        never += int(hopeless.sum())
        np.testing.assert_allclose(np.minimum(view.optimistic[present] / env.cap, 1.0), obs["slots"][present, 4],
                                   rtol=1e-6)
        lower += int(np.sum(view.optimistic[present] < view.predicted[present] - 1))
    assert lower > 0 and never > 0  # the samples do spread, and some never cross


def test_probe_feature_counts_observations_up_to_probe_points(smoke_bank):
    """`probe_points` adds a last slot feature, observed / P capped at 1, beside the optimistic one,
    and hands P to allocators; it is refused below the predictor's 4-point warm-up."""
    env = MultiNodeEnv(EnvConfig(bank=str(smoke_bank), split="test", arrival_prob=0.1,
                                 optimistic_quantile=0.15, probe_points=12))
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    seen = set()
    for _ in range(80):
        obs, *_ = env.step(random_valid_action(obs, 7, rng, idle_prob=0.0))
        assert obs["slots"].shape == (16, 6) and env.observation_space.contains(obs)
        view = env.scheduler_view()
        present = view.present
        np.testing.assert_allclose(obs["slots"][present, 5], np.minimum(view.observed[present], 12) / 12)
        assert view.probe_points == 12
        seen |= set(np.round(obs["slots"][present, 5] * 12).astype(int).tolist())
    assert {1, 6, 12} <= seen  # counts beyond the warm-up's 4 are told apart
    with pytest.raises(ValueError, match="probe_points must be >= 4"):
        EnvConfig(probe_points=3)


def test_training_bursts_put_doomed_tasks_before_short_ones(smoke_bank):
    env = make(smoke_bank, split="train", burst_prob=1.0).unwrapped
    plain = make(smoke_bank, split="train").unwrapped
    for seed in range(5):
        env.reset(seed=seed)
        plain.reset(seed=seed)
        ep = env.episode
        assert ep.meta.get("burst") and "burst" not in plain.episode.meta
        assert np.all(np.diff(ep.arrival) >= 0)  # still in arrival order
        burst = ep.meta["burst"]
        demand = true_demand(ep, env.curves)
        doomed = (ep.arrival == burst["start"]) & (demand > env.cap)
        short = (ep.arrival == burst["start"] + burst["delay"]) & (demand <= 40)
        assert doomed.sum() >= burst["doomed"] >= 3 and short.sum() >= burst["short"] >= 6
        assert ep.deadline[short].min() > ep.deadline[doomed].max()  # the short ones end later
        assert (ep.deadline[short] - ep.arrival[short] >= demand[short]).all()  # and are feasible alone
    with pytest.raises(ValueError, match="burst_prob"):
        make(smoke_bank, burst_prob=2.0)


def test_a_load_range_draws_each_training_episodes_load_and_leaves_given_episodes_alone(smoke_bank):
    ranged = make(smoke_bank, split="train", horizon=400, arrival_prob=0.02, arrival_prob_max=0.2).unwrapped
    fixed = make(smoke_bank, split="train", horizon=400, arrival_prob=0.02).unwrapped
    counts = []
    for seed in range(12):
        ranged.reset(seed=seed)
        counts.append(len(ranged.episode))
        fixed.reset(seed=seed)
        assert len(fixed.episode) <= 25  # p = 0.02 over 400 steps: 8 expected
    assert min(counts) <= 25 < 40 <= max(counts)  # loads from near 0.02 to near 0.2 (8 to 80)
    ranged.reset(seed=3)
    again = ranged.episode
    ranged.reset(seed=3)
    assert ranged.episode.curve_ids == again.curve_ids  # the drawn load follows the seed
    ranged.reset(options={"episode": fixed.episode})  # a frozen episode is replayed as it is
    assert ranged.episode is fixed.episode


def test_fit_horizon_sizes_late_arrivals_to_the_time_left(smoke_bank):
    """With exact thresholds and windows ≥ demand, every task fits unless clipping cuts it off."""
    curves = load_curves(smoke_bank, "id", "train")
    exact = dict(unreachable_frac=0.0, eps_jitter=0.0, window_lo=1.1, window_hi=1.8)
    feasible = {}
    for fit in (False, True):
        rng = np.random.default_rng(0)
        episodes = [sample_episode(curves, 500, 0.04, WorkloadConfig(fit_horizon=fit, **exact), rng)
                    for _ in range(10)]
        feasible[fit] = np.concatenate([slack(ep, curves) >= 0 for ep in episodes])
    assert feasible[True].all()
    assert feasible[False].mean() < 0.9  # late long tasks cannot finish before the horizon


@pytest.mark.parametrize("task_set", ["id", "rl_ood", "vit_ood"])
def test_windows_are_sized_to_where_the_threshold_is_first_reached(smoke_bank, task_set):
    """With exact thresholds, window / true demand is the drawn factor for every family, including
    curves that dip and rise again (RL OOD), where sizing to the target demand gives far more."""
    curves = load_curves(smoke_bank, task_set, "test")
    cfg = WorkloadConfig(unreachable_frac=0.0, eps_jitter=0.0)
    rng = np.random.default_rng(0)
    episodes = [sample_episode(curves, 500, 0.04, cfg, rng) for _ in range(10)]
    demand = np.concatenate([true_demand(ep, curves) for ep in episodes])
    window = np.concatenate([ep.window for ep in episodes])
    free = (window > cfg.min_window) & (window < curves.cap)  # not clipped
    assert free.sum() >= 20
    ratio = window[free] / demand[free]
    assert ratio.min() >= cfg.window_lo - 0.5 / demand[free].min()
    assert ratio.max() <= cfg.window_hi + 0.5 / demand[free].min()
    with pytest.raises(ValueError, match="window_basis"):
        sample_episode(curves, 500, 0.04, WorkloadConfig(window_basis="deadline"), rng)


def test_trend_features_show_progress_and_its_projection_to_the_deadline(smoke_bank):
    """`trend_window` = W adds two last slot features: progress q, and q at the deadline if the
    slope of q over the last W observations held (/ 2, capped at 1); nothing else changes."""
    w = 8
    # RL OOD: DQN TD losses whose cumulative averages also rise.
    env = MultiNodeEnv(EnvConfig(bank=str(smoke_bank), task_set="rl_ood", split="test", arrival_prob=0.1,
                                 probe_points=12, trend_window=w))
    plain = MultiNodeEnv(EnvConfig(bank=str(smoke_bank), task_set="rl_ood", split="test", arrival_prob=0.1,
                                   probe_points=12))
    obs, _ = env.reset(seed=2)
    base, _ = plain.reset(seed=2)
    rng = np.random.default_rng(0)
    rising = falling = 0
    for _ in range(150):
        action = random_valid_action(obs, 7, rng, idle_prob=0.1)
        obs, reward, *_ = env.step(action)
        base, plain_reward, *_ = plain.step(action)
        assert env.observation_space.contains(obs) and obs["slots"].shape == (16, 7)
        np.testing.assert_array_equal(obs["slots"][:, :5], base["slots"])
        assert reward == plain_reward
        for s in np.flatnonzero(obs["slot_mask"]):
            k, n = env.slot_task[s], env.n_obs[env.slot_task[s]]
            if n == 0:
                continue
            back = max(n - 1 - w, 0)
            now, then = (env.log_first[k] - env.task_log_avg[k, [n - 1, back]]) * env.q_scale[k]
            assert obs["slots"][s, 5] == pytest.approx(min(max(now, 0.0), 1.0), abs=1e-6)
            slope = (now - then) / max(n - 1 - back, 1)
            steps = min(max(env.deadline[k] - env.t, 0), env.cap - n)
            expected = np.clip(env.q[k] + slope * steps, 0.0, 2.0) / 2
            assert obs["slots"][s, 6] == pytest.approx(expected, abs=1e-6)
            rising += expected > env.q[k] / 2 + 1e-6
            falling += expected < env.q[k] / 2 - 1e-6
    assert rising > 0 and falling > 0  # trends of both signs appear
    with pytest.raises(ValueError, match="trend_window must be >= 2"):
        EnvConfig(trend_window=1)
