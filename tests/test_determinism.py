"""Same seed, same result: two trainings with one config agree bit for bit.

The default profile's layout (2 env runners, each a pooled vector env with FM inside, the
optimistic and probe features, the `lara_optimistic` teacher with DAgger) at smoke size:
the warm start, its validation at iteration 0, every logged metric of every iteration and
the exported policy (the last iteration's) must be identical between the two runs, and
another seed must give another result.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import torch

from mara_common.profile import Profile
from mara_env.env import EnvConfig
from mara_rl.policy import POLICY_WEIGHTS
from mara_rl.run_state import warm_start_dir
from mara_rl.scheduler_config import SchedulerConfig
from mara_rl.train_scheduler import EXPERIMENT, train

TIMING = ("env_steps_per_s", "iteration_seconds")  # wall-clock, not results




def _metrics(client: mlflow.MlflowClient, run_name: str) -> dict[tuple[str, int], float]:
    (run,) = mlflow.search_runs(experiment_names=[EXPERIMENT], output_format="list",
                                filter_string=f"tags.mlflow.runName = '{run_name}'")
    return {(key, m.step): m.value for key in run.data.metrics if key not in TIMING
            for m in client.get_metric_history(run.info.run_id, key)}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / POLICY_WEIGHTS, map_location="cpu", weights_only=True)


def test_same_seed_same_training(smoke_bank: Path, untrained_fm, mlflow_store: str, tmp_path: Path,
                                 ray_local: None) -> None:
    fm_path = untrained_fm.export(tmp_path / "fm")
    cfg = Profile.load("smoke").section(
        SchedulerConfig, "scheduler", predictor="fm", fm_path=str(fm_path), seed=3, iterations=2, num_env_runners=2,
        num_envs_per_env_runner=2, train_batch_size=400, minibatch_size=200,  # 100 steps per env
        imitation_episodes=2, imitation_teacher="lara_optimistic", imitation_epochs=2,
        imitation_dagger_rounds=1, imitation_dagger_epochs=1, eval_every=1, eval_episodes=4,
        export_best=False)  # export PPO's last policy
    env_cfg = EnvConfig(bank=str(smoke_bank), predictor=cfg.predictor_spec(), horizon=100, arrival_prob=0.2, burst_prob=0.25,
                        optimistic_quantile=0.15, probe_points=12)
    runs = {"a": cfg, "b": cfg, "other": SchedulerConfig(**{**vars(cfg), "seed": 4})}
    policies = {name: train(c, env_cfg, tmp_path / name, run_name=name) for name, c in runs.items()}

    client = mlflow.MlflowClient(mlflow_store)
    a, b, other = (_metrics(client, name) for name in runs)
    assert ("val_success_rate", 0) in a and ("policy_loss", 2) in a  # the warm start's validation and PPO's
    assert a == b and a != other
    for folder in (lambda name: policies[name], lambda name: warm_start_dir(tmp_path / name)):
        first, second = _weights(folder("a")), _weights(folder("b"))
        assert first.keys() == second.keys()
        for key in first:
            assert torch.equal(first[key], second[key]), key
        assert not all(torch.equal(first[k], v) for k, v in _weights(folder("other")).items())
