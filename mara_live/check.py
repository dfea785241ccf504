"""What the simulator says about a live run: its replay on the live curves, and its prediction.

- `replay_live_run`: the simulator (a plain `MultiNodeEnv`) replays the stream on
  the bank the live run saved. It must reproduce every logged decision and every
  success: the whole loop — training on Ray, checkpoints, restores after faults,
  the forecasts — left nothing in the run that its curves do not explain.
- `predicted_success`: the simulator's forecast for the stream before any job ran,
  replayed on the bank curves that set each job's threshold (`Stream.stand_in_episode`):
  what evaluation on recorded runs says this method would achieve.
- `family_prediction`: the same stream replayed on other recorded runs of each job's
  family, drawn at random and averaged over draws. A live job is a fresh run of its
  family, not its stand-in, whose own curve also set its threshold; this is the
  simulator's expectation for such a run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, MultiNodeEnv, load_curves
from mara_env.vector import BatchDecide, replay_in_lockstep
from mara_env.workload import Episode
from mara_live.curves import LIVE_TASK_SET
from mara_live.log import LOG
from mara_live.placement import Placement
from mara_live.runner import BANK, RESULT
from mara_live.streams import Stream

FAMILY_DRAW_SALT = 0xFA11  # keeps the family draws apart from the stream's own seeds


def placed(decide: BatchDecide) -> BatchDecide:
    """`decide` for one env with the live runner's node placement (`Placement`)."""
    placement = Placement()

    def run(obs: dict[str, np.ndarray], envs: list[MultiNodeEnv]) -> np.ndarray:
        (env,) = envs
        return placement.place(decide(obs, envs)[0], env)[None]
    return run


def replay_live_run(make_decide: Callable[[], BatchDecide], env_cfg: EnvConfig, stream: Stream, run_dir: Path) -> dict:
    """Replay a finished live run in the simulator (`env_cfg` as the run had it): {"decisions",
    "matching_decisions", "successes_match", "replayed_success_rate"}."""
    cfg = replace(env_cfg, bank=str(run_dir / BANK), task_set=LIVE_TASK_SET, split="test", horizon=stream.horizon)
    logged = [json.loads(line)["action"] for line in (run_dir / LOG).read_text().splitlines()]
    actions: list[list[int]] = []
    with torch_threads(1):
        out = replay_in_lockstep(cfg, [stream.episode()], placed(make_decide()),
                                 on_step=lambda i, obs, action, reward: actions.append(action.tolist()))[0]
    live = json.loads((run_dir / RESULT).read_text())
    return {"decisions": len(logged), "matching_decisions": sum(a == b for a, b in zip(actions, logged, strict=False)),
            "successes_match": out["succeeded"].tolist() == live["succeeded"],
            "replayed_success_rate": float(out["success_rate"])}


def mean_success(make_decide: Callable[[], BatchDecide], env_cfg: EnvConfig, episodes: list[Episode]) -> float:
    """The simulator's mean success rate over `episodes` (of the bank split `env_cfg` names)."""
    with torch_threads(1):
        outs = replay_in_lockstep(replace(env_cfg, horizon=episodes[0].horizon), episodes, make_decide())
    return float(np.mean([out["success_rate"] for out in outs]))


def predicted_success(make_decide: Callable[[], BatchDecide], env_cfg: EnvConfig, stream: Stream) -> float:
    """The simulator's success rate for `stream` on the bank's recorded runs (the stand-ins)."""
    return mean_success(make_decide, env_cfg, [stream.stand_in_episode()])


def family_prediction(make_decide: Callable[[], BatchDecide], env_cfg: EnvConfig, stream: Stream, draws: int,
                      seed: int) -> float:
    """Mean success over `draws` replays of `stream` in which each job runs as another bank run
    of its family (its stand-in excluded unless it is the family's only run), drawn with `seed`."""
    curves = load_curves(env_cfg.bank_path, env_cfg.task_set, env_cfg.split)
    rng = np.random.default_rng([seed, FAMILY_DRAW_SALT])
    base = stream.stand_in_episode()
    episodes = []
    for _ in range(draws):
        ids = []
        for cid, job in zip(base.curve_ids, stream.jobs, strict=True):
            family = curves.families == job.kind
            others = curves.ids[family & (curves.ids != cid)]
            others = others if len(others) else curves.ids[family]  # a family with one run in the split
            ids.append(str(others[rng.integers(len(others))]))
        episodes.append(replace(base, curve_ids=ids))
    return mean_success(make_decide, env_cfg, episodes)
