"""What the simulator says about a live run: its replay on the live curves, and its prediction.

- `replay_live_run`: the simulator (a plain `MultiNodeEnv`) replays the stream on
  the bank the live run saved. It must reproduce every logged decision and every
  success: the whole loop — training on Ray, checkpoints, restores after faults,
  the forecasts — left nothing in the run that its curves do not explain.
- `predicted_success`: the simulator's forecast for the stream before any job ran,
  replayed on the bank curves that set each job's threshold (`Stream.stand_in_episode`):
  what evaluation on recorded runs says this method would achieve.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from mara_common.threads import torch_threads
from mara_env.env import EnvConfig, MultiNodeEnv
from mara_env.vector import BatchDecide, replay_in_lockstep
from mara_live.curves import LIVE_TASK_SET
from mara_live.runner import BANK, LOG, RESULT, Placement
from mara_live.streams import Stream


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


def predicted_success(make_decide: Callable[[], BatchDecide], env_cfg: EnvConfig, stream: Stream) -> float:
    """The simulator's success rate for `stream` on the bank's recorded runs (the stand-ins)."""
    with torch_threads(1):
        return float(replay_in_lockstep(replace(env_cfg, horizon=stream.horizon), [stream.stand_in_episode()],
                                        make_decide())[0]["success_rate"])
