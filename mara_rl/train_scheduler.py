"""Train the MAT scheduler with RLlib's PPO inside the simulator (DESIGN §7).

The frozen predictor runs inside `mara_env/MultiNode-v0`; γ = 1 so the
return is the shaped success count (DESIGN §4). Every iteration is
checkpointed into the output folder, and a rerun with the same folder
resumes where it stopped (same MLflow run). The trained policy is exported
as a plain state dict plus a JSON description, so evaluation can load it
with `load_policy` and act with `act` without building an Algorithm.

Which policy is exported (`SchedulerConfig.export_best`): the last, or the
best of the periodic validations, where "best" means the highest ID-val
success rate among the evaluations that complete every feasible task of a
validation stress episode (DESIGN §8's pattern on val curves), or among all
evaluations if none does. Whether PPO keeps the stress lesson until the last
iteration depends on the seed; a validation that checks it keeps a policy
that learned it. A warm-started run also validates its imitated policy
before PPO (iteration 0), so a warm start that PPO only erodes is kept.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from mara_env import ENV_ID
from mara_env.env import (
    VIEW_OPTIONS,
    EnvConfig,
    MultiNodeEnv,
    load_curves,
    make_spaces,
    sample_episodes,
)
from mara_env.vector import PooledVectorEnv, replay_in_lockstep
from mara_env.workload import oracle_successes, stress_episode
from mara_fm.fm_predictor import torch_threads
from mara_fm.predictors import predictor_digest
from mara_fm.profile import section_config
from mara_fm.tracking import mlflow_run
from mara_rl.anchored_ppo import ANCHOR_KL
from mara_rl.mat_module import MATConfig, MATModule

EXPERIMENT = "mara-scheduler"
POLICY_WEIGHTS, POLICY_SPEC = "policy.pt", "policy.json"
# Operational settings a resume may change; anything else must match the run being resumed.
RESUMABLE_CHANGES = ("iterations", "num_env_runners", "pool_predictions", "torch_threads", "eval_every",
                     "sample_timeout_s")
IMITATION_SEED = 2_000_000  # + 1000 · seed: the teacher's episodes, apart from eval_seed's
EPISODE_METRICS = ("success_rate", "episode_successes", "episode_tasks", "utilisation",
                   "episode_invalid_actions")


@dataclass
class SchedulerConfig:
    """Every knob of scheduler training; profile section `[scheduler]`."""

    # What the env runs.
    predictor: str = "wls"  # wls | oracle | fm (the model at fm_path) | fm:<path>
    fm_path: str = ""
    beta: float = 0.1
    seed: int = 0
    # Share of training episodes with an overload burst (EnvConfig.burst_prob): without
    # any, the policy never learns that serving hopeless tasks can starve others.
    burst_prob: float = 0.0
    # PPO (MAT reference: clip 0.05-0.2, entropy 0.01, GAE λ 0.95, 10-15 epochs).
    iterations: int = 150
    train_batch_size: int = 8000
    minibatch_size: int = 1000
    num_epochs: int = 10
    lr: float = 5e-4
    gamma: float = 1.0
    gae_lambda: float = 0.95
    clip_param: float = 0.2
    entropy_coeff: float = 0.001  # summed over N nodes: ≈ 0.01 per agent / 7
    vf_loss_coeff: float = 0.5
    vf_clip_param: float = 1e4  # RLlib's 10 would zero the value gradient: returns reach ~20
    kl_coeff: float = 0.0  # MAT uses no KL penalty
    grad_clip: float = 10.0
    # Warm start (mara_rl.imitation): before PPO, fit the MAT to this allocator's joint
    # actions, and its value head to their returns, on this many training episodes
    # (0 = off: PPO from a random MAT).
    imitation_episodes: int = 0
    imitation_teacher: str = "lara"
    imitation_epochs: int = 20
    imitation_lr: float = 1e-3
    # DAgger after the fit (mara_rl.imitation): rounds of MAT-played episodes (as many as
    # imitation_episodes each) labelled by the teacher, each followed by this many epochs
    # over all demonstrations so far. 0 = behaviour cloning only.
    imitation_dagger_rounds: int = 0
    imitation_dagger_epochs: int = 10
    # KL anchor to the imitated policy during PPO (mara_rl.anchored_ppo; 0 = plain PPO).
    anchor_coeff: float = 0.0
    # Network (MATConfig).
    embed_dim: int = 64
    n_heads: int = 1
    n_blocks: int = 1
    ff_dim: int = 64
    work_conserving: bool = False
    # Sampling.
    num_env_runners: int = 2
    num_envs_per_env_runner: int = 8
    # Step a runner's envs together with one predictor call per step (mara_env.vector);
    # the same samples as independent envs, several times faster with FM inside.
    pool_predictions: bool = True
    # RLlib's 60 s default returns no samples at all when the FM env is slow under load.
    sample_timeout_s: float = 900.0
    torch_threads: int = 1  # learner threads in the driver; tiny matrices gain nothing from more
    # Evaluation on ID validation episodes (greedy). It picks the exported iteration, so it
    # needs enough episodes to see differences of a point: on 8, one policy's score moves by
    # about 3 points between episode sets (README, "Decision: the exported policy").
    eval_every: int = 5
    eval_episodes: int = 128
    eval_seed: int = 1_000_000
    export_best: bool = True  # export the best validated policy, not the last (module docstring)

    def __post_init__(self) -> None:
        from mara_rl.imitation import check_teacher

        check_teacher(self.imitation_teacher)
        if self.imitation_dagger_rounds < 0:
            raise ValueError(f"imitation_dagger_rounds must be >= 0, got {self.imitation_dagger_rounds}")
        if self.imitation_dagger_rounds > 0 and self.imitation_episodes <= 0:
            raise ValueError("imitation_dagger_rounds > 0 continues the imitation warm start: "
                             "it needs imitation_episodes > 0")
        if self.anchor_coeff < 0:
            raise ValueError(f"anchor_coeff must be >= 0, got {self.anchor_coeff}")
        if self.anchor_coeff > 0 and self.imitation_episodes <= 0:
            raise ValueError("anchor_coeff > 0 anchors PPO to the warm-started policy: "
                             "it needs imitation_episodes > 0")

    def mat_config(self) -> MATConfig:
        return MATConfig(self.embed_dim, self.n_heads, self.n_blocks, self.ff_dim, self.work_conserving)

    def predictor_spec(self) -> str:
        if self.predictor == "fm":
            if not self.fm_path:
                raise ValueError("predictor 'fm' needs fm_path (--fm PATH) to an exported FM predictor")
            return f"fm:{Path(self.fm_path).resolve()}"
        return self.predictor


# ---------------------------------------------------------------- env and metrics
def training_env(cfg: SchedulerConfig, profile: str, bank: Path) -> EnvConfig:
    """The env a scheduler trains in: the profile's `[env]` on ID train, with this run's
    predictor, β and burst share."""
    return section_config(EnvConfig, profile, "env", bank=str(bank.resolve()), predictor=cfg.predictor_spec(),
                          beta=cfg.beta, task_set="id", split="train", burst_prob=cfg.burst_prob)


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


def module_spec(env_cfg: EnvConfig, mat: MATConfig) -> RLModuleSpec:
    obs, act = make_spaces(env_cfg.n_nodes, env_cfg.n_slots, env_cfg.slot_features)
    return RLModuleSpec(module_class=MATModule, observation_space=obs, action_space=act,
                        model_config=asdict(mat))


# ---------------------------------------------------------------- policy export / use
def export_policy(module: MATModule, path: Path, env_cfg: EnvConfig) -> Path:
    """Weights + sizes + the env it was trained in (predictor spec and content digest,
    observation layout); loads without an Algorithm."""
    path.mkdir(parents=True, exist_ok=True)
    predictor = str(env_cfg.predictor)
    spec = {"n_nodes": module.n_nodes, "n_slots": module.n_slots, "model_config": asdict(module.cfg),
            "predictor": predictor, "predictor_digest": predictor_digest(predictor),
            **env_cfg.view_options}
    torch.save(module.state_dict(), path / POLICY_WEIGHTS)
    (path / POLICY_SPEC).write_text(json.dumps(spec, indent=1))
    return path


def _spec_view(spec: dict[str, Any]) -> dict[str, Any]:
    """The `VIEW_OPTIONS` a policy spec records (None for one exported before the option existed)."""
    return {name: spec.get(name) for name in VIEW_OPTIONS}


def load_policy(path: str | Path) -> MATModule:
    """The exported MAT module, in eval mode, on CPU."""
    path = Path(path)
    for name in (POLICY_SPEC, POLICY_WEIGHTS):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name}: exported policy file missing "
                                    "(train one with `mara train-scheduler`)")
    spec = json.loads((path / POLICY_SPEC).read_text())
    layout = EnvConfig(**_spec_view(spec))
    obs, act_space = make_spaces(spec["n_nodes"], spec["n_slots"], layout.slot_features)
    module = RLModuleSpec(module_class=MATModule, observation_space=obs, action_space=act_space,
                          model_config=spec["model_config"]).build()
    module.load_state_dict(torch.load(path / POLICY_WEIGHTS, map_location="cpu", weights_only=True))
    return module.eval()


def policy_env(path: str | Path) -> dict[str, Any]:
    """The env settings an exported policy was trained with, which the env it runs in
    must share: `predictor` (spec) and the `VIEW_OPTIONS` (observation layout).

    Raises if the predictor's files have changed since (policies exported before
    digests were recorded are not checked).
    """
    spec_path = Path(path) / POLICY_SPEC
    if not spec_path.exists():
        raise FileNotFoundError(f"{spec_path}: exported policy file missing")
    spec = json.loads(spec_path.read_text())
    predictor, trained_with = spec["predictor"], spec.get("predictor_digest")
    if trained_with is not None and predictor_digest(predictor) != trained_with:
        raise ValueError(f"{path}: the predictor {predictor} has changed since this policy was trained "
                         "(its files no longer match); retrain the policy or restore that predictor")
    return {"predictor": predictor, **_spec_view(spec)}


def act(module: MATModule, obs: dict[str, np.ndarray]) -> np.ndarray:
    """Greedy joint action(s) for one observation (N,) or a stacked batch (B, N)."""
    single = np.ndim(obs["slot_mask"]) == 1
    batch = {k: torch.as_tensor(np.asarray(v)) for k, v in obs.items()}
    if single:
        batch = {k: v.unsqueeze(0) for k, v in batch.items()}
    with torch.inference_mode():
        actions = module.forward_inference({Columns.OBS: batch})[Columns.ACTIONS].numpy()
    return actions[0] if single else actions


def evaluate_policy(module: MATModule, env_cfg: EnvConfig, episodes: int, seed: int) -> dict[str, float]:
    """Greedy rollouts on seeded validation episodes plus one validation stress episode,
    stepped in lockstep for batched inference.

    `stress_complete` is 1 when the policy finishes every feasible task of the stress
    episode (the Oracle bound), else 0.
    """
    base = dataclasses.replace(env_cfg, split="val", burst_prob=0.0)
    curves = load_curves(base.bank_path, base.task_set, base.split)
    stress = stress_episode(curves, base.horizon, seed=seed)
    *finals, stress_final = replay_in_lockstep(base, [*sample_episodes(base, episodes, seed), stress],
                                               lambda obs, envs: act(module, obs))
    bound = oracle_successes(stress, curves)
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
    from ray.rllib.algorithms.ppo import PPOConfig

    from mara_rl.anchored_ppo import AnchoredPPOTorchLearner

    if cfg.anchor_coeff > 0 and out_dir is None:
        raise ValueError("anchor_coeff > 0 needs the run folder that holds the warm-start policy")
    anchor = {"anchor_coeff": cfg.anchor_coeff,
              "anchor_policy": str(warm_start_dir(out_dir)) if out_dir is not None else ""}
    return (
        PPOConfig()
        .environment(ENV_ID, env_config=asdict(env_cfg))
        .env_runners(num_env_runners=cfg.num_env_runners,
                     num_envs_per_env_runner=cfg.num_envs_per_env_runner,
                     gym_env_vectorize_mode="vector_entry_point" if cfg.pool_predictions else "sync",
                     sample_timeout_s=cfg.sample_timeout_s)
        .learners(num_learners=0, learner_config_dict=anchor)
        .training(gamma=cfg.gamma, lambda_=cfg.gae_lambda, clip_param=cfg.clip_param,
                  entropy_coeff=cfg.entropy_coeff, vf_loss_coeff=cfg.vf_loss_coeff,
                  vf_clip_param=cfg.vf_clip_param, use_kl_loss=cfg.kl_coeff > 0,
                  kl_coeff=cfg.kl_coeff, grad_clip=cfg.grad_clip, lr=cfg.lr,
                  num_epochs=cfg.num_epochs, minibatch_size=cfg.minibatch_size,
                  train_batch_size_per_learner=cfg.train_batch_size,
                  learner_class=AnchoredPPOTorchLearner)
        .rl_module(rl_module_spec=module_spec(env_cfg, cfg.mat_config()))
        .callbacks(EpisodeMetrics)
        .debugging(seed=cfg.seed)
    )


def build_algorithm(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path | None = None) -> Any:
    """RLlib's PPO for this run, on the Ray already connected or a new local one."""
    import ray
    from ray.tune.registry import register_env

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False)
    register_env(ENV_ID, make_env)
    return ppo_config(cfg, env_cfg, out_dir).build_algo()


def warm_start(algo: Any, module: MATModule, cfg: SchedulerConfig, env_cfg: EnvConfig,
               out_dir: Path) -> dict[str, float]:
    """Imitation before PPO: fit `module` to the teacher (then DAgger rounds), export it (the
    anchor's reference), then load it into the learner and every env runner. Returns how
    close it was to the teacher before and after, and on its own states in each round."""
    from mara_rl.imitation import demonstrations, imitate, score

    seed = IMITATION_SEED + 1000 * cfg.seed
    demos = demonstrations(env_cfg, cfg.imitation_teacher, cfg.imitation_episodes, seed)
    before = score(module, demos)
    imitate(module, demos, cfg.imitation_epochs, cfg.imitation_lr, cfg.seed)
    rounds: dict[str, float] = {}
    stride = max(100, cfg.imitation_episodes)  # round r plays episodes seed + r·stride + i: new ones
    for r in range(1, cfg.imitation_dagger_rounds + 1):
        visited = demonstrations(env_cfg, cfg.imitation_teacher, cfg.imitation_episodes, seed + stride * r,
                                 driver=lambda obs, envs: act(module, obs))
        rounds[f"imitation_dagger{r}_node_agreement_on_policy"] = score(module, visited)["node_agreement"]
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


def _state_path(out_dir: Path) -> Path:
    return out_dir / "state.json"


def warm_start_dir(out_dir: Path) -> Path:
    """Where a warm-started run keeps its imitated policy (PPO's anchor, mara_rl.anchored_ppo)."""
    return out_dir / "warm_start_policy"


def policy_dir(out_dir: Path) -> Path:
    """Where a training run in `out_dir` exports its policy (`load_policy` reads it)."""
    return out_dir / "policy"


def _comparable(cfg: SchedulerConfig, env_cfg: EnvConfig) -> dict[str, Any]:
    """What must match for a resume to continue the same experiment."""
    scheduler = {k: v for k, v in asdict(cfg).items() if k not in RESUMABLE_CHANGES}
    return json.loads(json.dumps({"scheduler": scheduler, "env": asdict(env_cfg)}, default=str))


def _config_changes(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Settings that differ from a stored run's. A setting added to the code after the run
    was stored counts as unchanged while it holds its default (what the run had in effect)."""
    defaults = _comparable(SchedulerConfig(), EnvConfig())
    return [f"{section}.{key}" for section, values in current.items() for key, value in values.items()
            if stored.get(section, {}).get(key, defaults[section].get(key)) != value]


def load_state(out_dir: Path) -> dict[str, Any]:
    """A run folder's stored progress and settings ({} before its first save)."""
    return json.loads(_state_path(out_dir).read_text()) if _state_path(out_dir).exists() else {}


def settings_changed(state: dict[str, Any], cfg: SchedulerConfig, env_cfg: EnvConfig, digest: str) -> list[str]:
    """What differs between a stored run (`load_state`) and `cfg`/`env_cfg`, the predictor's
    files (`digest`, its current `predictor_digest`) included: a resume or reuse must find
    nothing here."""
    if not state:
        return []
    changed = _config_changes(state["config"], _comparable(cfg, env_cfg))
    if state.get("predictor_digest", digest) != digest:
        changed.append(f"the files of predictor {env_cfg.predictor}")
    return changed


def _save_checkpoint(algo: Any, out_dir: Path) -> Path:
    """Write next to the old checkpoint, then swap, so a crash never leaves none."""
    final, tmp, old = out_dir / "checkpoint", out_dir / "checkpoint.tmp", out_dir / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    algo.save_to_path(str(tmp.resolve()))
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def train(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path, run_name: str | None = None,
          fresh: bool = False) -> Path:
    """PPO until `cfg.iterations`; returns the exported policy folder."""
    out_dir = out_dir.resolve()
    if fresh:
        shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = load_state(out_dir)
    digest = predictor_digest(env_cfg.predictor)
    changed = settings_changed(state, cfg, env_cfg, digest)
    if changed:
        raise ValueError(f"{out_dir} holds a run with a different config ({', '.join(changed)}); "
                         "use --fresh or another --out")
    policy = policy_dir(out_dir)
    if state.get("iteration", -1) >= cfg.iterations and (policy / POLICY_SPEC).exists():
        print(f"{out_dir} is trained to iteration {state['iteration']}: nothing to do")
        return policy

    with torch_threads(cfg.torch_threads):
        return _train_loop(cfg, env_cfg, out_dir, state, run_name, digest)


def _best_policy_dir(out_dir: Path, iteration: int) -> Path:
    """Where the policy validated at `iteration` is kept while it is the best so far. Named
    by iteration, so the folder the state records is always the policy it scored, even
    after a crash between an export and the state write."""
    return out_dir / f"best_policy-{iteration}"


def _train_loop(cfg: SchedulerConfig, env_cfg: EnvConfig, out_dir: Path, state: dict[str, Any],
                run_name: str | None, digest: str) -> Path:
    torch.manual_seed(cfg.seed)
    algo = build_algorithm(cfg, env_cfg, out_dir)
    checkpoint = out_dir / "checkpoint"
    if state and checkpoint.exists():
        algo.restore_from_path(str(checkpoint))
    evaluator = module_spec(env_cfg, cfg.mat_config()).build()

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
            export_policy(evaluator, _best_policy_dir(out_dir, it), env_cfg)
        return {f"val_{k}": v for k, v in scores.items()}

    tags = {"predictor": cfg.predictor, "beta": cfg.beta, "seed": cfg.seed, "out_dir": out_dir}
    with mlflow_run(EXPERIMENT, run_name, tags=tags, run_id=state.get("mlflow_run_id")) as run:
        import mlflow

        if not state:
            mlflow.log_params({**{f"scheduler.{k}": v for k, v in asdict(cfg).items()},
                               **{f"env.{k}": v for k, v in asdict(env_cfg).items()}})
            if cfg.imitation_episodes > 0:
                # The warm-started policy is itself a candidate for export (iteration 0):
                # PPO's first iterations can undo part of what imitation taught.
                warm = warm_start(algo, evaluator, cfg, env_cfg, out_dir)
                if cfg.eval_every > 0:
                    warm.update(validate(0))
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
            mlflow.log_metrics(metrics, step=it)
            _save_checkpoint(algo, out_dir)
            state = {"iteration": it, "env_steps": steps, "mlflow_run_id": run.info.run_id,
                     "config": _comparable(cfg, env_cfg), "best": best, "predictor_digest": digest}
            _state_path(out_dir).write_text(json.dumps(state, indent=1))
            for stale in out_dir.glob("best_policy-*"):
                if best is None or stale != _best_policy_dir(out_dir, best["iteration"]):
                    shutil.rmtree(stale)
            print(f"iteration {it}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())),
                  flush=True)
        policy = policy_dir(out_dir)
        if best is not None:
            shutil.rmtree(policy, ignore_errors=True)
            shutil.copytree(_best_policy_dir(out_dir, best["iteration"]), policy)
            mlflow.set_tags({"exported_iteration": best["iteration"]})
            mlflow.log_metrics({f"exported_val_{k}": v for k, v in best.items() if k != "iteration"})
        else:
            export_policy(sync_evaluator(), policy, env_cfg)
        mlflow.log_artifacts(str(policy), artifact_path="policy")
    algo.stop()
    return policy
