"""A vector env that answers every sub-env's prediction queries in one call.

Each step of `MultiNodeEnv` asks its predictor about the (at most N) tasks it
just served. For the FM predictor the cost of a call is mostly fixed (a GRU
over a dozen points, a few small matmuls), so stepping M envs in lockstep
and pooling their queries into one batch of up to M·N prefixes makes every
env step cheaper. Results are those of M independent envs: every predictor
answers each prefix on its own.

Registered as the `vector_entry_point` of `mara_env/MultiNode-v0`, so
`gymnasium.make_vec("mara_env/MultiNode-v0", num_envs=M,
vectorization_mode="vector_entry_point")` builds it; RLlib's env runners use
it with `gym_env_vectorize_mode="vector_entry_point"`. `replay_in_lockstep`
does the same for frozen evaluation episodes, with one batched policy call
per step as well.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from copy import deepcopy
from dataclasses import replace
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate, iterate

from mara_env.env import SUCCEEDED, EnvConfig, MultiNodeEnv
from mara_env.workload import Episode
from mara_fm.predictors import Predictor, make_predictor


class PooledVectorEnv(SyncVectorEnv):
    """M `MultiNodeEnv`s sharing one predictor, stepped together (next-step autoreset)."""

    def __init__(self, num_envs: int, config: EnvConfig | None = None, **overrides: Any) -> None:
        config = config or EnvConfig.from_overrides(**overrides)
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        shared = replace(config, predictor=make_predictor(config.predictor))
        super().__init__([functools.partial(MultiNodeEnv, shared)] * num_envs,
                         autoreset_mode=AutoresetMode.NEXT_STEP)
        self.predictor = shared.predictor

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        """An int `seed` is spread over the sub-envs through a `SeedSequence`, not as seed + i:
        with seed + i, the sub-envs of a runner seeded s + 1 (RLlib seeds runner w with s + w)
        would replay those of the runner seeded s, shifted by one."""
        if isinstance(seed, int):
            seed = [int(x) for x in np.random.SeedSequence(seed).generate_state(self.num_envs)]
        return super().reset(seed=seed, options=options)

    def step(self, actions):
        infos: dict[str, Any] = {}
        stepped: list[int] = []
        for i, (env, action) in enumerate(zip(self.envs, iterate(self.action_space, actions), strict=True)):
            if self._autoreset_envs[i]:
                self._env_obs[i], info = env.reset()
                self._rewards[i], self._terminations[i] = 0.0, False
            else:
                self._rewards[i], self._terminations[i], info = env.advance(action)
                stepped.append(i)
            self._truncations[i] = False
            infos = self._add_info(infos, info, i)
        answer_queries([self.envs[i] for i in stepped], self.predictor)
        for i in stepped:
            self._env_obs[i] = self.envs[i].observation()
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._autoreset_envs = self._terminations.copy()
        obs = deepcopy(self._observations) if self.copy else self._observations
        return (obs, self._rewards.copy(), self._terminations.copy(),
                self._truncations.copy(), infos)


def answer_queries(envs: list[MultiNodeEnv], predictor: Predictor) -> None:
    """One predictor call for the prediction queries of every env (they share a curve set
    and a config)."""
    queries = [env.prediction_query() for env in envs]
    sizes = [len(q[0]) for q in queries]
    if not sum(sizes):
        return
    rows, lengths, eps, horizon = (np.concatenate(parts) for parts in zip(*queries, strict=True))
    answers = predictor.replay_remaining(envs[0].curves, rows, lengths, eps, horizon,
                                         envs[0].cfg.optimistic_quantile)
    for env, part in zip(envs, np.split(answers, np.cumsum(sizes)[:-1]), strict=True):
        env.store_predictions(part)


BatchDecide = Callable[[dict[str, np.ndarray], list[MultiNodeEnv]], np.ndarray]
StepRecord = Callable[[int, dict[str, np.ndarray], np.ndarray, float], None]


def replay_in_lockstep(config: EnvConfig, episodes: list[Episode], decide: BatchDecide,
                       on_step: StepRecord | None = None) -> list[dict]:
    """Play `episodes` side by side: each step, one `decide` call on the stacked
    observations (B, ...) of the running envs, and one predictor call for all.

    Returns, per episode, the env's end-of-episode summary plus `shaped_return` and
    `succeeded` (one flag per task, in the episode's arrival order). `on_step(i, obs,
    action, reward)` sees every transition of episode i, in order.
    """
    shared = replace(config, predictor=make_predictor(config.predictor))
    envs = [MultiNodeEnv(shared) for _ in episodes]
    for env, episode in zip(envs, episodes, strict=True):
        env.reset(options={"episode": episode})
    return play_in_lockstep(envs, decide, on_step)


def play_in_lockstep(envs: list[MultiNodeEnv], decide: BatchDecide,
                     on_step: StepRecord | None = None) -> list[dict]:
    """`replay_in_lockstep` from where each env stands (reset, or mid-episode); the shaped
    return counts from there. The envs share one predictor."""
    obs = [env.observation() for env in envs]
    returns = [0.0] * len(envs)
    results: list[dict | None] = [None] * len(envs)
    live = list(range(len(envs)))
    while live:
        stacked = {k: np.stack([obs[i][k] for i in live]) for k in obs[live[0]]}
        actions = decide(stacked, [envs[i] for i in live])
        for i, action in zip(live, actions, strict=True):
            reward, done, info = envs[i].advance(action)
            if on_step is not None:
                on_step(i, obs[i], action, reward)
            returns[i] += reward
            if done:
                results[i] = {**info, "shaped_return": returns[i], "succeeded": envs[i].status == SUCCEEDED}
        answer_queries([envs[i] for i in live], envs[0].predictor)
        live = [i for i in live if results[i] is None]
        for i in live:
            obs[i] = envs[i].observation()
    return results
