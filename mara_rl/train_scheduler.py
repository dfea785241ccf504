"""Train the MAT scheduler with RLlib's PPO inside the simulator (docs/design.md §7).

The frozen predictor runs inside `mara_env/MultiNode-v0`; γ = 1 so the
return is the shaped success count (docs/design.md §4). Every iteration is
checkpointed into the output folder, and a rerun with the same folder
resumes where it stopped (same MLflow run). The trained policy is exported
as a plain state dict plus a JSON description, so evaluation can load it
with `load_policy` and act with `act` without building an Algorithm.

Which policy is exported (`SchedulerConfig.export_best`): the last, or the
best of the periodic validations, where "best" means the highest ID-val
success rate among the evaluations that complete every feasible task of a
validation stress episode (docs/design.md §8's pattern on val curves), or among all
evaluations if none does. Whether PPO keeps the stress lesson until the last
iteration depends on the seed; a validation that checks it keeps a policy
that learned it. A warm-started run also validates its imitated policy
before PPO (iteration 0), so a warm start that PPO only erodes is kept.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import ray
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.tune.registry import register_env

from mara_common.config import ConfigError
from mara_common.threads import torch_threads
from mara_common.tracking import mlflow_run
from mara_env import ENV_ID
from mara_env.env import EnvConfig, MultiNodeEnv, load_curves, sample_episodes
from mara_env.vector import PooledVectorEnv, replay_in_lockstep
from mara_env.workload import oracle_successes, stress_episode
from mara_rl.anchored_ppo import ANCHOR_KL, AnchoredPPOTorchLearner
from mara_rl.imitation import demonstrations, imitate, score
from mara_rl.mat_module import MATModule
from mara_rl.policy import POLICY_SPEC, act, export_policy, module_spec
from mara_rl.provenance import input_tags
from mara_rl.run_state import (
    START_OVER,
    best_policy_dir,
    checkpoint_dir,
    commit_checkpoint,
    comparable,
    is_run_folder,
    load_state,
    policy_dir,
    run_inputs,
    settings_changed,
    warm_start_dir,
)
from mara_rl.scheduler_config import SchedulerConfig

EXPERIMENT = "mara-scheduler"
IMITATION_SEED = 2_000_000  # + 1000 · seed: the teacher's episodes, apart from eval_seed's
# RLlib seeds env runner w with (its seed + w): spaced this far apart, the runners of different
# training seeds never share a seed (and so never replay the same episode stream).
RUNNER_SEED_STRIDE = 1000
EPISODE_METRICS = ("success_rate", "episode_successes", "episode_tasks", "utilisation",
                   "episode_invalid_actions")



# ---------------------------------------------------------------- env and metrics
def make_env(env_config: dict[str, Any]) -> MultiNodeEnv | PooledVectorEnv:
    """Env creator for RLlib's registry, which works in every Ray worker process.

    RLlib passes `num_envs` when it asks for a whole vector env (vectorize
    mode "vector_entry_point"): then all of a runner's envs share one
    predictor call per step. One torch thread per env runner: the FM
    predictor runs tiny ops, and OpenMP workers competing for the cores slow
    them 10-100x.
    """
    torch.set_num_threads(1)
    overrides = {k: v for k, v in env_config.items() if k != "num_envs"}
    if "num_envs" in env_config:
        return PooledVectorEnv(env_config["num_envs"], **overrides)
    return MultiNodeEnv(**overrides)


class EpisodeMetrics(RLlibCallback):
    """Per-iteration means of the env's end-of-episode summary and of the shaped return.

    RLlib's own `episode_return_mean` is smoothed over 100 episodes; these
    are reset at every iteration (the "mean" stat clears on reduce).
    """

    def on_episode_end(self, *, episode: Any, prev_episode_chunks: list[Any] | None = None,
                       metrics_logger: Any = None, **kwargs: Any) -> None:
        info = episode.get_infos(-1)
        for key in EPISODE_METRICS:
            if key in info:
                metrics_logger.log_value(key, float(info[key]), reduce="mean")
        chunks = [*(prev_episode_chunks or []), episode]
        metrics_logger.log_value("shaped_return", sum(c.get_return() for c in chunks), reduce="mean")


# ---------------------------------------------------------------- validation
def evaluate_policy(module: MATModule, env_cfg: EnvConfig, episodes: int, seed: int) -> dict[str, float]:
    """Greedy rollouts on seeded validation episodes plus one validation stress episode,
    stepped in lockstep for batched inference.

    `stress_complete` is 1 when the policy finishes every feasible task of the stress
    episode (the Oracle bound), else 0.
    """
    base = dataclasses.replace(env_cfg, split="val", burst_prob=0.0, arrival_prob_max=None)
    curves = load_curves(base.bank_path, base.task_set, base.split)
    stress = stress_episode(curves, base.horizon, seed=seed)
    *finals, stress_final = replay_in_lockstep(base, [*sample_episodes(base, episodes, seed), stress],
                                               lambda obs, envs: act(module, obs))
    bound = oracle_successes(stress, curves, base.fastest)
    return {"success_rate": float(np.mean([f["success_rate"] for f in finals])),
            "shaped_return": float(np.mean([f["shaped_return"] for f in finals])),
            "invalid_actions": float(sum(f["episode_invalid_actions"] for f in finals)),
            "stress_successes": float(stress_final["episode_successes"]),
            "stress_complete": float(stress_final["episode_successes"] >= bound)}


def selection_key(scores: dict[str, float]) -> tuple[float, float]:
    """Order of validated policies for `export_best`: stress-complete first, then success rate."""
    return scores["stress_complete"], scores["success_rate"]


# ---------------------------------------------------------------- training
def ppo_config(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path | None = None) -> Any:
    """RLlib's PPO config for this run; `out_dir` holds the anchor's reference policy."""
    if cfg.anchor_coeff > 0 and out_dir is None:
        raise ConfigError("anchor_coeff > 0 needs the run folder that holds the warm-start policy")
    anchor = {"anchor_coeff": cfg.anchor_coeff,
              "anchor_policy": str(warm_start_dir(out_dir)) if out_dir is not None else ""}
    return (
        PPOConfig()
        .environment(ENV_ID, env_config=asdict(env_cfg))
        .env_runners(num_env_runners=cfg.num_env_runners,
                     num_envs_per_env_runner=cfg.num_envs_per_env_runner,
                     gym_env_vectorize_mode="vector_entry_point" if cfg.pool_predictions else "sync",
                     sample_timeout_s=cfg.sample_timeout_s)
        .learners(num_learners=0, learner_config_dict=anchor, learner_class=AnchoredPPOTorchLearner)
        .training(gamma=cfg.gamma, lambda_=cfg.gae_lambda, clip_param=cfg.clip_param,
                  entropy_coeff=cfg.entropy_coeff, vf_loss_coeff=cfg.vf_loss_coeff,
                  vf_clip_param=cfg.vf_clip_param, use_kl_loss=cfg.kl_coeff > 0,
                  kl_coeff=cfg.kl_coeff, grad_clip=cfg.grad_clip, lr=cfg.lr,
                  num_epochs=cfg.num_epochs, minibatch_size=cfg.minibatch_size,
                  train_batch_size_per_learner=cfg.train_batch_size)
        .rl_module(rl_module_spec=module_spec(env_cfg, cfg.mat))
        .callbacks(EpisodeMetrics)
        .debugging(seed=RUNNER_SEED_STRIDE * cfg.seed)
    )


def build_algorithm(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path | None = None) -> Any:
    """RLlib's PPO for this run, on the Ray already connected or a new local one."""
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    register_env(ENV_ID, make_env)
    return ppo_config(cfg, env_cfg, out_dir).build_algo()


def warm_start(algo: Any, module: MATModule, cfg: SchedulerConfig, env_cfg: EnvConfig,
               out_dir: Path) -> dict[str, float]:
    """Imitation before PPO: fit `module` to the teacher (then DAgger rounds), export it (the
    anchor's reference), then load it into the learner and every env runner. Returns how
    close it was to the teacher before and after, and on its own states in each round."""
    seed = IMITATION_SEED + 1000 * cfg.seed
    demos = demonstrations(env_cfg, cfg.imitation_teacher, cfg.imitation_episodes, seed)
    before = score(module, demos)
    imitate(module, demos, cfg.imitation_epochs, cfg.imitation_lr, cfg.seed)
    print(f"imitation: cloned {cfg.imitation_teacher} on {len(demos)} decisions "
          f"({cfg.imitation_episodes} episodes)", flush=True)
    rounds: dict[str, float] = {}
    stride = max(100, cfg.imitation_episodes)  # round r plays episodes seed + r·stride + i: new ones
    for r in range(1, cfg.imitation_dagger_rounds + 1):
        visited = demonstrations(env_cfg, cfg.imitation_teacher, cfg.imitation_episodes, seed + stride * r,
                                 driver=lambda obs, envs: act(module, obs))
        agreement = rounds[f"imitation_dagger{r}_node_agreement_on_policy"] = score(module, visited)["node_agreement"]
        print(f"imitation: DAgger round {r}/{cfg.imitation_dagger_rounds}, per-node agreement on the MAT's "
              f"own states {agreement:.3f}", flush=True)
        demos = demos + visited
        imitate(module, demos, cfg.imitation_dagger_epochs, cfg.imitation_lr, cfg.seed + r)
    after = score(module, demos)
    export_policy(module, warm_start_dir(out_dir), env_cfg)
    algo.learner_group.set_weights({DEFAULT_MODULE_ID: module.get_state()})
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group,
                                       inference_only=True, timeout_seconds=120.0)
    return {**{f"imitation_{k}_before": v for k, v in before.items()},
            **{f"imitation_{k}": v for k, v in after.items()}, **rounds}


def iteration_metrics(result: dict[str, Any], seconds: float, steps: float) -> dict[str, float]:
    runners = result.get("env_runners", {})
    learner = result.get("learners", {}).get(DEFAULT_MODULE_ID, {})
    picked = {
        "success_rate": runners.get("success_rate"),
        "shaped_return": runners.get("shaped_return"),
        "episodes": runners.get("num_episodes"),
        "invalid_actions": runners.get("episode_invalid_actions"),
        "policy_loss": learner.get("policy_loss"),
        "vf_loss": learner.get("vf_loss"),
        "vf_explained_var": learner.get("vf_explained_var"),
        "entropy": learner.get("entropy"),
        "kl": learner.get("mean_kl_loss"),
        "anchor_kl": learner.get(ANCHOR_KL),
        "env_steps_per_s": steps / seconds if seconds > 0 else None,
        "iteration_seconds": seconds,
    }
    return {k: float(v) for k, v in picked.items() if v is not None and math.isfinite(float(v))}


def train(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path, run_name: str | None = None,
          fresh: bool = False, tags: dict[str, Any] | None = None) -> Path:
    """PPO until `cfg.iterations`; returns the exported policy folder.

    A folder that holds a run continues it, if its settings, bank and predictor
    are the same (else ConfigError); `fresh` deletes the run first (and refuses a
    folder that holds anything else).
    """
    out_dir = out_dir.resolve()
    if fresh and out_dir.exists():
        if not is_run_folder(out_dir):
            raise ConfigError(f"--fresh would delete {out_dir}, which holds more than a scheduler run; "
                              "choose another --out")
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = load_state(out_dir)
    inputs = run_inputs(env_cfg)
    changed = settings_changed(state, cfg, env_cfg, inputs)
    if changed:
        raise ConfigError(f"{out_dir} holds a run with other settings or inputs ({', '.join(changed)}); "
                          f"{START_OVER}, or choose another --out")
    policy = policy_dir(out_dir)
    if state.get("iteration", -1) >= cfg.iterations and (policy / POLICY_SPEC).exists():
        print(f"{out_dir} is trained to iteration {state['iteration']}: nothing to do")
        return policy
    # Training goes on past an earlier export: that export is not this run's result any more.
    shutil.rmtree(policy, ignore_errors=True)
    with torch_threads(cfg.torch_threads):
        return _train_loop(cfg, env_cfg, out_dir, state, run_name, inputs, tags or {})


def _train_loop(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path, state: dict[str, Any],
                run_name: str | None, inputs: dict[str, str], tags: dict[str, Any]) -> Path:
    torch.manual_seed(cfg.seed)
    algo = build_algorithm(cfg, env_cfg, out_dir)
    try:
        if state:
            algo.restore_from_path(str(checkpoint_dir(out_dir)))
        # The warm start fits this module from its initial weights: drawn from the run's seed, not
        # from whatever random state building RLlib's learner left behind.
        torch.manual_seed(cfg.seed)
        evaluator = module_spec(env_cfg, cfg.mat).build()

        def sync_evaluator() -> MATModule:
            evaluator.set_state(algo.learner_group.get_weights([DEFAULT_MODULE_ID])[DEFAULT_MODULE_ID])
            return evaluator

        best = state.get("best")

        def validate(it: int) -> dict[str, float]:
            """Score the learner's policy on validation episodes; keep it if it is the best yet."""
            nonlocal best
            scores = evaluate_policy(sync_evaluator(), env_cfg, cfg.eval_episodes, cfg.eval_seed)
            if cfg.export_best and (best is None or selection_key(scores) > selection_key(best)):
                best = {**scores, "iteration": it}
                export_policy(evaluator, best_policy_dir(out_dir, it), env_cfg)
            return {f"val_{k}": v for k, v in scores.items()}

        def commit(it: int, steps: float, run_id: str) -> None:
            """Checkpoint and state in one step; then drop best policies no state refers to."""
            commit_checkpoint(algo, out_dir, {"iteration": it, "env_steps": steps, "mlflow_run_id": run_id,
                                              "config": comparable(cfg, env_cfg), "best": best,
                                              "inputs": inputs})
            for stale in out_dir.glob("best_policy-*"):
                if best is None or stale != best_policy_dir(out_dir, best["iteration"]):
                    shutil.rmtree(stale)

        tags = {"predictor": cfg.predictor, "beta": cfg.beta, "seed": cfg.seed, "out_dir": out_dir,
                **input_tags(inputs), **tags}
        # A resume continues the run's MLflow run in the store that holds it (`mlflow_run`).
        with mlflow_run(EXPERIMENT, run_name, tags=tags, run_id=state.get("mlflow_run_id")) as run:
            if run.info.run_id != state.get("mlflow_run_id"):  # a new run (under another store too)
                mlflow.log_params({**{f"scheduler.{k}": v for k, v in asdict(cfg).items()},
                                   **{f"env.{k}": v for k, v in asdict(env_cfg).items()}})
            if not state and cfg.imitation_episodes > 0:
                # The warm-started policy is itself a candidate for export (iteration 0):
                # PPO's first iterations can undo part of what imitation taught.
                warm = warm_start(algo, evaluator, cfg, env_cfg, out_dir)
                if cfg.eval_every > 0:
                    warm.update(validate(0))
                commit(0, 0.0, run.info.run_id)
                mlflow.log_metrics(warm, step=0)
                print("imitation: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(warm.items())), flush=True)
            steps_before = float(state.get("env_steps", 0))
            while algo.iteration < cfg.iterations:
                start = time.perf_counter()
                result = algo.train()
                seconds = time.perf_counter() - start
                steps = float(result.get("num_env_steps_sampled_lifetime", steps_before))
                metrics = iteration_metrics(result, seconds, steps - steps_before)
                steps_before = steps
                it = algo.iteration
                if cfg.eval_every > 0 and (it % cfg.eval_every == 0 or it == cfg.iterations):
                    metrics.update(validate(it))
                # Logged once the iteration is committed: a crash before that redoes it, unlogged.
                commit(it, steps, run.info.run_id)
                mlflow.log_metrics(metrics, step=it)
                print(f"iteration {it}/{cfg.iterations}: "
                      + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())), flush=True)
            policy = policy_dir(out_dir)
            if best is not None:
                shutil.rmtree(policy, ignore_errors=True)
                shutil.copytree(best_policy_dir(out_dir, best["iteration"]), policy)
                mlflow.set_tags({"exported_iteration": best["iteration"]})
                mlflow.log_metrics({f"exported_val_{k}": v for k, v in best.items() if k != "iteration"})
                if not best["stress_complete"]:  # selection fell back to the success rate alone
                    print(f"warning: no validated policy finished every feasible task of the validation "
                          f"stress episode (best {best['stress_successes']:.0f} successes); exported "
                          f"iteration {best['iteration']} by its success rate", file=sys.stderr, flush=True)
            else:
                export_policy(sync_evaluator(), policy, env_cfg)
            mlflow.log_artifacts(str(policy), artifact_path="policy")
        return policy
    finally:
        algo.stop()  # its env runners too, also when training fails
