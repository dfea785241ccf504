"""Training runs that advance one batch at a time and can be paused, moved and resumed.

A `TrainingJob` is the unit both stages share: the curve bank records jobs run
without a pause (`Family.run`), and the live scheduler (`mara_live`) trains the
same jobs a batch per tick on whichever node it picks, checkpointing them in
between (docs/design.md §11). A job's `state_dict` holds everything its next
batch depends on — model, optimiser, the data order and its random generators —
so a job restored from it continues exactly the curve it would have produced
uninterrupted (tests/test_jobs.py checks this for every family).

A user's own training code becomes a job by implementing the three methods of
`TrainingJob`; `mara_live.streams` finds it by an import path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

Batch = tuple[torch.Tensor, torch.Tensor]
Schedule = torch.optim.lr_scheduler.LRScheduler | None  # stepped after every batch


@runtime_checkable
class TrainingJob(Protocol):
    """One training run: `step` trains one batch and returns its loss; the state round-trips."""

    def step(self) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class SupervisedJob:
    """Minibatch training over shuffled epochs of an in-memory dataset."""

    def __init__(self, data: Batch, model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 optimizer: torch.optim.Optimizer, gen: torch.Generator, batch_size: int,
                 schedule: Schedule = None) -> None:
        self.x, self.y = data
        self.model, self.loss_fn, self.optimizer, self.gen = model, loss_fn, optimizer, gen
        self.schedule = schedule
        self.batch_size = batch_size
        self.order = torch.randperm(len(self.x), generator=gen)
        self.pos = 0

    def step(self) -> float:
        if self.pos + self.batch_size > len(self.x):  # a new epoch, reshuffled
            self.order, self.pos = torch.randperm(len(self.x), generator=self.gen), 0
        idx = self.order[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        loss = self.loss_fn(self.model(self.x[idx]), self.y[idx])
        return _descend(self.model, self.optimizer, loss, self.schedule)

    def state_dict(self) -> dict[str, Any]:
        return {**_learner_state(self.model, self.optimizer, self.schedule, self.gen),
                "order": self.order, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load_learner_state(state, self.model, self.optimizer, self.schedule, self.gen)
        self.order, self.pos = state["order"].clone(), int(state["pos"])


class LanguageModelJob:
    """Next-character prediction on random windows of a token stream."""

    def __init__(self, corpus: torch.Tensor, vocab: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                 gen: torch.Generator, batch_size: int, context: int = 24, schedule: Schedule = None) -> None:
        self.corpus, self.vocab, self.model, self.optimizer, self.gen = corpus, vocab, model, optimizer, gen
        self.schedule = schedule
        self.batch_size, self.context = batch_size, context
        self.offsets = torch.arange(context + 1)

    def step(self) -> float:
        start = torch.randint(0, len(self.corpus) - self.context - 1, (self.batch_size, 1), generator=self.gen)
        window = self.corpus[start + self.offsets]
        logits = self.model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), window[:, 1:].reshape(-1))
        return _descend(self.model, self.optimizer, loss, self.schedule)

    def state_dict(self) -> dict[str, Any]:
        return _learner_state(self.model, self.optimizer, self.schedule, self.gen)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _load_learner_state(state, self.model, self.optimizer, self.schedule, self.gen)


class DQNJob:
    """DQN with a replay buffer: one env step and one gradient step per batch.

    The loss is the Huber TD loss of each gradient step (what an RL practitioner
    watches; it need not fall monotonically). The first `warmup` env steps fill
    the buffer at construction; ε decays linearly over `warmup + planned` steps.
    The env itself is part of the state (Gymnasium's classic-control envs pickle
    with their random generators).
    """

    def __init__(self, env_id: str, make_q: Callable[[int, int], nn.Module], gen: torch.Generator,
                 batch_size: int, lr: float, planned: int, warmup: int = 256, target_every: int = 50) -> None:
        import gymnasium as gym

        self.env = gym.make(env_id)
        n_obs, n_act = self.env.observation_space.shape[0], int(self.env.action_space.n)
        self.q, self.target = make_q(n_obs, n_act), make_q(n_obs, n_act)
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=lr)
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        self.rng = np.random.default_rng(seed)
        self.batch_size, self.warmup, self.target_every = batch_size, warmup, target_every
        self.size = warmup + planned
        self.buffer = {"o": np.zeros((self.size, n_obs), np.float32), "a": np.zeros(self.size, np.int64),
                       "r": np.zeros(self.size, np.float32), "n": np.zeros((self.size, n_obs), np.float32),
                       "d": np.zeros(self.size, np.float32)}
        self.obs, _ = self.env.reset(seed=seed)
        self.env.action_space.seed(seed)
        self.t = 0
        for _ in range(warmup):
            self._act_and_store()

    def _act_and_store(self) -> None:
        t = self.t
        if t >= self.size:  # past the planned length: keep the last slot for new transitions
            raise RuntimeError(f"DQN job trained past its planned {self.size - self.warmup} batches")
        explore = max(0.05, 1.0 - t / (0.6 * self.size))
        if t < self.warmup or self.rng.random() < explore:
            action = int(self.env.action_space.sample())
        else:
            with torch.no_grad():
                action = int(self.q(torch.as_tensor(self.obs)).argmax())
        nxt, reward, term, trunc, _ = self.env.step(action)
        for key, value in zip("oarnd", (self.obs, action, reward, nxt, float(term)), strict=True):
            self.buffer[key][t] = value
        self.obs = nxt
        if term or trunc:
            self.obs, _ = self.env.reset()
        self.t += 1

    def step(self) -> float:
        self._act_and_store()
        idx = self.rng.integers(0, self.t, self.batch_size)
        b = {k: torch.as_tensor(v[idx]) for k, v in self.buffer.items()}
        with torch.no_grad():
            y = b["r"] + 0.99 * (1 - b["d"]) * self.target(b["n"]).max(1).values
        loss = _descend(self.q, self.optimizer, F.smooth_l1_loss(self.q(b["o"]).gather(1, b["a"][:, None]).squeeze(1), y))
        if (self.t - 1 - self.warmup) % self.target_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        return loss

    def state_dict(self) -> dict[str, Any]:
        return {"q": self.q.state_dict(), "target": self.target.state_dict(), "optimizer": self.optimizer.state_dict(),
                "rng": self.rng.bit_generator.state, "buffer": self.buffer, "env": self.env, "obs": self.obs,
                "t": self.t}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.bit_generator.state = state["rng"]
        self.buffer = {k: v.copy() for k, v in state["buffer"].items()}
        self.env = copy.deepcopy(state["env"])
        self.obs, self.t = state["obs"].copy(), int(state["t"])


def lr_schedule(optimizer: torch.optim.Optimizer, kind: str, planned: int, warmup: float = 0.1,
                milestones: tuple[float, ...] = (0.5, 0.75), gamma: float = 0.2) -> Schedule:
    """A per-batch learning-rate schedule over a run of `planned` batches.

    `kind`: "constant"; "step" (× `gamma` at each milestone, a fraction of `planned`);
    "cosine" (to 0 at `planned`); "warmup" (linear from 0 over the first `warmup` share,
    then constant); "warmup_cosine" (that warm-up, then cosine). These are the kinks real
    curves show where a schedule changes pace (docs/design.md §2).
    """
    n_warm = max(1, round(warmup * planned))

    def factor(t: int) -> float:
        warm = min(1.0, (t + 1) / n_warm) if kind.startswith("warmup") else 1.0
        if kind == "step":
            return gamma ** sum(t >= m * planned for m in milestones)
        if kind in ("cosine", "warmup_cosine"):
            start = n_warm if kind == "warmup_cosine" else 0
            done = min(1.0, max(0, t - start) / max(1, planned - start))
            return warm * 0.5 * (1 + np.cos(np.pi * done))
        if kind in ("constant", "warmup"):
            return warm
        raise ValueError(f"unknown learning-rate schedule {kind!r} (constant, step, cosine, warmup, warmup_cosine)")

    factor(0)  # an unknown kind fails here, not at the first batch
    return None if kind == "constant" else torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _learner_state(model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Schedule,
                   gen: torch.Generator) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "gen": gen.get_state(),
            "schedule": schedule.state_dict() if schedule is not None else None}


def _load_learner_state(state: dict[str, Any], model: nn.Module, optimizer: torch.optim.Optimizer,
                        schedule: Schedule, gen: torch.Generator) -> None:
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    gen.set_state(state["gen"])
    if schedule is not None:
        schedule.load_state_dict(state["schedule"])


def _descend(model: nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor,
             schedule: Schedule = None) -> float:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if schedule is not None:
        schedule.step()
    return float(loss.item())
