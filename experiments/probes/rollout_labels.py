"""Labels from paired rollouts: where another action beats the teacher's, judged with hindsight.

At a state the learner reached, the teacher's joint action competes with a few
candidates of two kinds:

- *swap*: the teacher's action with one served task replaced by a waiting one
  (held until the next decision; the teacher decides afterwards);
- *drop*: the teacher giving up one task it serves now, for the rest of the
  episode, as if it had judged it hopeless.

Each candidate is played on its own copy of the env (`MultiNodeEnv.clone`) to
the episode's end, and the one with the most successes gives the state's label:
its first joint action (the teacher's own on ties). Fitting the policy to these
labels on its own states is one step of policy iteration over the teacher
(AggreVaTe, Ross & Bagnell 2014). The copies of a state share every future
arrival and curve, so a candidate's difference is its own effect, which across
PPO's sampled episodes drowns in how lucky each workload was. The rollouts read
the true curves; the fitted policy sees only its observation, so it learns
where deviating pays on average over states that look alike.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from mara_env.env import MultiNodeEnv
from mara_env.registry import ALLOCATORS
from mara_env.slot_view import SlotView
from mara_env.vector import BatchDecide, answer_queries, play_in_lockstep

KINDS = ("swap", "drop")


def view_without(env: MultiNodeEnv, dropped: set[int] | None) -> SlotView:
    """The env's scheduler view with the tasks `dropped` (given up) hidden."""
    view = env.scheduler_view()
    if not dropped:
        return view
    return dataclasses.replace(view, present=view.present & ~np.isin(env.slot_task, list(dropped)))


def blind_teacher(teacher: str, dropped: dict[int, set[int]]) -> BatchDecide:
    """The allocator `teacher`, blind to the tasks `dropped[id(env)]` of each env it decides for."""
    allocator = ALLOCATORS[teacher]()

    def decide(obs: dict[str, np.ndarray] | None, envs: list[MultiNodeEnv]) -> np.ndarray:
        return np.stack([allocator.act(view_without(env, dropped.get(id(env)))) for env in envs])

    return decide


def candidates(kind: str, action: np.ndarray, env: MultiNodeEnv, count: int | None,
               rng: np.random.Generator) -> list[np.ndarray | int]:
    """Up to `count` alternatives to `action`, drawn at random: joint actions (swap) or served tasks
    to give up (drop). `count` None: every one, in node order (a function of the state alone)."""
    served = action[action > 0] - 1
    if kind == "drop":
        tasks = env.slot_task[served]
        return [int(k) for k in (tasks if count is None else rng.permutation(tasks)[:count])]
    taken = set(served.tolist())
    waiting = [s + 1 for s in np.flatnonzero(env.slot_task >= 0).tolist() if s not in taken]
    pairs = [(node, pick) for node in np.flatnonzero(action > 0).tolist() for pick in waiting]
    swapped = []
    for j in (range(len(pairs)) if count is None else rng.permutation(len(pairs))[:count]):
        alternative = action.copy()
        alternative[pairs[j][0]] = pairs[j][1]
        swapped.append(alternative)
    return swapped


def judge(teacher: str, env: MultiNodeEnv, action: np.ndarray,
          options: list[tuple[str, np.ndarray | int]]) -> tuple[list[int], list[np.ndarray]]:
    """Paired rollouts from `env`'s state: the teacher's `action`, then each (kind, candidate).
    Returns each one's successes at the episode's end and its first joint action."""
    copies = [env.clone() for _ in range(len(options) + 1)]
    dropped = {id(c): {x} for c, (kind, x) in zip(copies[1:], options, strict=True) if kind == "drop"}
    decide = blind_teacher(teacher, dropped)
    firsts = [action]
    for c, (kind, x) in zip(copies[1:], options, strict=True):
        firsts.append(x if kind == "swap" else decide(None, [c])[0])
    running = [c for c, first in zip(copies, firsts, strict=True) if not c.advance(first)[1]]
    answer_queries(running, env.predictor)
    play_in_lockstep(running, decide)
    return [c.stats["successes"] for c in copies], firsts


@dataclass
class RolloutLabeller:
    """A `BatchDecide` for `mara_rl.imitation.demonstrations`: the teacher's action, replaced
    by the best candidate at a `share` of the contended states (those where the teacher leaves
    a task waiting). `gains` collects, per judged state, the successes the label adds, and
    `improved` the (observation, label) of each state where that is more than 0."""

    teacher: str
    per_kind: int = 2  # candidates of each kind
    share: float = 0.5
    seed: int = 0
    gains: list[int] = field(default_factory=list)
    improved: list[tuple[dict[str, np.ndarray], np.ndarray]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.plain = blind_teacher(self.teacher, {})

    def __call__(self, obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        labels = self.plain(obs, envs)
        for i, env in enumerate(envs):
            contended = (env.slot_task >= 0).sum() > (labels[i] > 0).sum()
            if not contended or self.rng.random() >= self.share:
                continue
            options = [(kind, x) for kind in KINDS
                       for x in candidates(kind, labels[i], env, self.per_kind, self.rng)]
            ends, firsts = judge(self.teacher, env, labels[i], options)
            best = int(np.argmax(ends))  # the first maximum: the teacher's own on ties
            self.gains.append(ends[best] - ends[0])
            labels[i] = firsts[best]
            if best:
                self.improved.append(({k: v[i] for k, v in obs.items()}, labels[i]))
        return labels
