"""Warm start for the MAT scheduler: imitate an allocator before PPO.

PPO from a random MAT spends its first iterations finding out what LARA
already knows (serve new tasks until they can be forecast, drop the hopeless,
serve the rest by deadline). Here the allocator plays training episodes in
the run's own env (same predictor, same burst share), and the MAT is fitted
to its joint actions by maximum likelihood, with the same teacher-forced
pass PPO uses to score stored actions. The value head is fitted to the
returns-to-go of those episodes (γ = 1, the shaped reward), so PPO's first
advantages are not measured against a random critic. PPO then starts from
the allocator's behaviour instead of from scratch.

With `imitation_dagger_rounds` > 0 the fit continues DAgger-style: the
imitated MAT plays fresh training episodes, the teacher labels every state
the MAT reached, those rows join the demonstrations and the MAT is refitted.
Behaviour cloning alone only sees the teacher's states; where the MAT's
small deviations lead elsewhere it has no example to follow (measured on
the default profile: per-node agreement with the teacher 0.95 on the
teacher's states, 0.90–0.93 on the MAT's own).

The teacher may be privileged (`lara_oracle`): LARA fed each task's true
remaining demand, read off the curve the env replays, while the MAT is
fitted on the observations of the run's own env (its predictor's
forecasts). Nothing privileged reaches the policy at run time; it learns the
choices a scheduler that knew the future would make, as far as the forecasts
let it tell them apart. The env's dynamics do not depend on its predictor, so
the teacher's episodes are the episodes LARA plays in an oracle env.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from ray.rllib.core.columns import Columns

from mara_env.allocators import LARA
from mara_env.env import EnvConfig, MultiNodeEnv, sample_episodes
from mara_env.registry import ALLOCATORS
from mara_env.slot_view import SlotView
from mara_env.vector import BatchDecide, replay_in_lockstep
from mara_fm.predictors import OraclePredictor
from mara_rl.mat_module import MASKED_LOGIT, MATModule
from mara_rl.methods import classic


@dataclass
class Demonstrations:
    """Every transition of the teacher's episodes, stacked."""

    obs: dict[str, torch.Tensor]  # each (T, ...)
    actions: torch.Tensor  # (T, N)
    returns: torch.Tensor  # (T,) shaped return-to-go, γ = 1

    def __len__(self) -> int:
        return len(self.actions)

    def rows(self, index: torch.Tensor) -> Demonstrations:
        """The transitions at `index` (positions or a boolean mask)."""
        return Demonstrations(obs={k: v[index] for k, v in self.obs.items()}, actions=self.actions[index],
                              returns=self.returns[index])

    def __add__(self, other: Demonstrations) -> Demonstrations:
        return Demonstrations(obs={k: torch.cat([v, other.obs[k]]) for k, v in self.obs.items()},
                              actions=torch.cat([self.actions, other.actions]),
                              returns=torch.cat([self.returns, other.returns]))


PRIVILEGED_TEACHER = "lara_oracle"
TEACHERS = (*sorted(ALLOCATORS), PRIVILEGED_TEACHER)


def true_demand_view(env: MultiNodeEnv, oracle: OraclePredictor) -> SlotView:
    """`env.scheduler_view()` with the prediction of every task served at least once
    replaced by its true remaining demand: what an env running the `oracle` predictor
    would hold (an unserved task keeps the env's initial answer, the curve cap)."""
    view = env.scheduler_view()
    slots = np.flatnonzero(view.present & (view.observed > 0))
    if not len(slots):
        return view
    tasks = env.slot_task[slots]
    seen = env.n_obs[tasks]
    predicted = view.predicted.copy()
    predicted[slots] = oracle.replay_remaining(env.curves, env.task_rows[tasks], seen, env.eps[tasks],
                                               (env.cap - seen).astype(np.float64))
    return replace(view, predicted=predicted)


def teacher_policy(teacher: str) -> BatchDecide:
    """The teacher's decisions for a batch of envs: an allocator, or LARA on true demand."""
    if teacher not in TEACHERS:
        raise ValueError(f"unknown imitation teacher {teacher!r}; known: {list(TEACHERS)}")
    if teacher == PRIVILEGED_TEACHER:
        lara, oracle = LARA(), OraclePredictor()
        return lambda obs, envs: np.stack([lara.act(true_demand_view(env, oracle)) for env in envs])
    return classic(teacher)()


def demonstrations(env_cfg: EnvConfig, teacher: str | BatchDecide, episodes: int, seed: int,
                   driver: BatchDecide | None = None) -> Demonstrations:
    """The teacher's (one of `TEACHERS`, or any batch decision rule, such as a search that
    labels states) joint actions on `episodes` episodes of `env_cfg`.

    With a `driver` the episodes are played by the driver, and the teacher only labels
    the states the driver reaches (DAgger); returns-to-go are then the driver's."""
    label = teacher_policy(teacher) if isinstance(teacher, str) else teacher
    labels: deque[np.ndarray] = deque()  # the teacher's actions, in the order the envs step
    steps: list[list[tuple[dict[str, np.ndarray], np.ndarray, float]]] = [[] for _ in range(episodes)]

    def decide(obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        labelled = label(obs, envs)
        if driver is None:
            return labelled
        labels.extend(labelled)
        return driver(obs, envs)

    def record(i: int, obs: dict[str, np.ndarray], action: np.ndarray, reward: float) -> None:
        steps[i].append((obs, action if driver is None else labels.popleft(), reward))

    replay_in_lockstep(env_cfg, sample_episodes(env_cfg, episodes, seed), decide, on_step=record)
    rows = [step for episode in steps for step in episode]
    returns = np.concatenate([np.cumsum([r for *_, r in episode][::-1])[::-1] for episode in steps])
    return Demonstrations(
        obs={k: torch.as_tensor(np.stack([o[k] for o, _, _ in rows])) for k in rows[0][0]},
        actions=torch.as_tensor(np.stack([a for _, a, _ in rows]), dtype=torch.long),
        returns=torch.as_tensor(returns, dtype=torch.float32),
    )


def _chosen_logits(module: MATModule, demos: Demonstrations) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The teacher-forced pass over the demonstrated joint actions: (its output, each node's
    logits (T, N, K+1), the logit of each node's demonstrated action (T, N))."""
    out = module.forward_train({Columns.OBS: demos.obs, Columns.ACTIONS: demos.actions})
    logits = out[Columns.ACTION_DIST_INPUTS].view(len(demos), module.n_nodes, -1)
    return out, logits, logits.gather(-1, demos.actions.unsqueeze(-1)).squeeze(-1)


def takeable(module: MATModule, demos: Demonstrations) -> torch.Tensor:
    """Which transitions' joint actions the MAT's masks allow (T,): only those can be imitated."""
    with torch.no_grad():
        _, _, chosen = _chosen_logits(module, demos)
    return (chosen > MASKED_LOGIT / 2).all(1)


def _losses(module: MATModule, demos: Demonstrations, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(−log π of the teacher's joint actions, value MSE, per-node greedy agreement) on `rows`."""
    batch = demos.rows(rows)
    out, logits, chosen = _chosen_logits(module, batch)
    if (chosen <= MASKED_LOGIT / 2).any():
        raise ValueError("the teacher took an action the MAT masks (a taken or empty slot, "
                         "or idle beside a waiting task); it cannot be imitated")
    nll = -(chosen - logits.logsumexp(-1)).sum(-1).mean()
    values = module.compute_values({Columns.OBS: batch.obs}, out.get(Columns.EMBEDDINGS))
    value_mse = F.mse_loss(values, batch.returns)
    agreement = (logits.argmax(-1) == batch.actions).float().mean()
    return nll, value_mse, agreement


def score(module: MATModule, demos: Demonstrations) -> dict[str, float]:
    """How close `module` is to the teacher: mean NLL of its joint actions, value MSE, and
    how often each node's greedy choice, given the teacher's earlier choices, is the teacher's."""
    with torch.no_grad():
        nll, value_mse, agreement = _losses(module, demos, torch.arange(len(demos)))
    return {"nll": float(nll), "value_mse": float(value_mse), "node_agreement": float(agreement)}


def imitate(module: MATModule, demos: Demonstrations, epochs: int, lr: float, seed: int,
            batch_size: int = 256, vf_coeff: float = 0.5) -> None:
    """Fit `module` in place: −log π(teacher's joint action) + vf_coeff · (V − return)²."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    module.train()
    for _ in range(epochs):
        for rows in torch.randperm(len(demos), generator=gen).split(batch_size):
            nll, value_mse, _ = _losses(module, demos, rows)
            opt.zero_grad()
            (nll + vf_coeff * value_mse).backward()
            opt.step()
    module.eval()
