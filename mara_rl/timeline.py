"""Which task each node served, step by step: one frozen episode per method, as a Gantt chart.

With the cluster options on, restores are shaded (a node busy without progress), and each
node's row is labelled with its speed. One panel per method, on the same episode.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mara_common.plotting import plt, save_figure
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import play_in_lockstep
from mara_env.workload import Episode
from mara_rl.methods import Method

TIMELINE_PNG = "timeline.png"


@dataclass
class Timeline:
    """served[t, i]: the task node i served at step t (-1: idle); restoring[t, i]: it was
    restoring then. `succeeded` flags each task; `speeds` are the nodes'."""

    served: np.ndarray
    restoring: np.ndarray
    succeeded: np.ndarray
    speeds: np.ndarray


class StepRecorder(MultiNodeEnv):
    """The env, keeping each node's task and restore state after every step (also the steps
    inside a held decision, `EnvConfig.decision_interval`)."""

    def __init__(self, config: EnvConfig) -> None:
        super().__init__(config)
        self.served: list[np.ndarray] = []
        self.restoring: list[np.ndarray] = []

    def _advance_step(self, action: np.ndarray) -> tuple[float, bool, dict]:
        out = super()._advance_step(action)
        self.served.append(self.node_task.copy())
        self.restoring.append(self.node_restoring.copy())
        return out


def record(method: Method, env_cfg: EnvConfig, episode: Episode) -> Timeline:
    """Replay `episode` with `method`, keeping each node's task and restore state per step."""
    cfg = method.env_config(env_cfg)
    env = StepRecorder(cfg)
    env.reset(options={"episode": episode})
    out = play_in_lockstep([env], method.make())[0]
    return Timeline(np.array(env.served), np.array(env.restoring), out["succeeded"], cfg.cluster.speeds(cfg.n_nodes))


def plot(timelines: dict[str, Timeline], path: Path) -> Path:
    """One panel per method: nodes as rows, a colour per task (grey hatching: restoring,
    a dark edge: a task that succeeded)."""
    fig, axes = plt.subplots(len(timelines), 1, figsize=(11, 1.0 + 0.32 * len(timelines) * 7),
                             sharex=True, squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, (name, tl) in zip(axes[:, 0], timelines.items(), strict=True):
        steps, nodes = tl.served.shape
        for i in range(nodes):
            t = 0
            while t < steps:
                task = tl.served[t, i]
                end = t + 1
                while end < steps and tl.served[end, i] == task and tl.restoring[end, i] == tl.restoring[t, i]:
                    end += 1
                if task >= 0:
                    ax.broken_barh([(t, end - t)], (i - 0.4, 0.8), facecolors=cmap(task % 20),
                                   edgecolors="black" if tl.succeeded[task] else "none", linewidth=0.3,
                                   hatch="////" if tl.restoring[t, i] else None, alpha=0.45 if tl.restoring[t, i] else 1)
                t = end
        ax.set_yticks(range(nodes), [f"node {i} ×{s:g}" for i, s in enumerate(tl.speeds)], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{name}: {int(tl.succeeded.sum())} of {len(tl.succeeded)} tasks succeed", fontsize=9)
    axes[-1, 0].set_xlabel("step")
    return save_figure(fig, path)
