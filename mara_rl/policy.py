"""A trained MAT policy outside training: export, load, act.

An exported policy is a folder with `policy.pt` (a plain state dict, read
with `weights_only=True`) and `policy.json` (network sizes, the predictor
the policy was trained with and a digest of its files, and the env's view
options), so evaluation and benchmarks load it without RLlib's Algorithm.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from mara_common.config import ConfigError
from mara_env.cluster import ClusterConfig
from mara_env.env import VIEW_OPTIONS, EnvConfig
from mara_fm.predictors import predictor_digest
from mara_rl.mat_module import MATConfig, MATModule

POLICY_WEIGHTS, POLICY_SPEC = "policy.pt", "policy.json"


def module_spec(env_cfg: EnvConfig, mat: MATConfig) -> RLModuleSpec:
    """The RLlib spec of a MAT for `env_cfg`'s spaces."""
    obs, act_space = env_cfg.spaces()
    return RLModuleSpec(module_class=MATModule, observation_space=obs, action_space=act_space,
                        model_config=asdict(mat))


def export_policy(module: MATModule, path: Path, env_cfg: EnvConfig) -> Path:
    """Weights + sizes + the env it was trained in (predictor spec and content digest,
    observation layout)."""
    path.mkdir(parents=True, exist_ok=True)
    predictor = str(env_cfg.predictor)
    spec = {"n_nodes": module.n_nodes, "n_slots": module.n_slots, "model_config": asdict(module.cfg),
            "predictor": predictor, "predictor_digest": predictor_digest(predictor),
            "cluster": asdict(env_cfg.cluster), "critic_features": env_cfg.critic_features,
            **env_cfg.view_options}
    torch.save(module.state_dict(), path / POLICY_WEIGHTS)
    (path / POLICY_SPEC).write_text(json.dumps(spec, indent=1))
    return path


def policy_digest(path: str | Path) -> str:
    """A hash of an exported policy's weights: their names, shapes and values, not the file's
    bytes (torch's archive also records the file's name). Two exports of the same weights, say
    from a retraining with the same seed, share it."""
    path = Path(path)
    _read_spec(path)
    sha = hashlib.sha256()
    state = torch.load(path / POLICY_WEIGHTS, weights_only=True)
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        sha.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        sha.update(tensor.numpy().tobytes())
    return sha.hexdigest()[:16]


def _read_spec(path: Path) -> dict[str, Any]:
    for name in (POLICY_SPEC, POLICY_WEIGHTS):
        if not (path / name).exists():
            raise FileNotFoundError(f"{path / name}: exported policy file missing "
                                    "(train one with `mara train-scheduler`)")
    try:
        spec = json.loads((path / POLICY_SPEC).read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path / POLICY_SPEC}: not valid JSON ({exc})") from None
    missing = [k for k in ("n_nodes", "n_slots", "model_config", "predictor") if k not in spec]
    if missing:
        raise ConfigError(f"{path / POLICY_SPEC}: missing key(s) {missing}; re-export the policy")
    return spec


def _spec_view(spec: dict[str, Any]) -> dict[str, Any]:
    """The `VIEW_OPTIONS` a policy spec records (None for one exported before the option existed)."""
    return {name: spec.get(name) for name in VIEW_OPTIONS}


def load_policy(path: str | Path) -> MATModule:
    """The exported MAT module, in eval mode, on CPU. A policy trained with a privileged critic
    (`EnvConfig.critic_features`) keeps its value network, which acting never reads."""
    path = Path(path)
    spec = _read_spec(path)
    layout = EnvConfig(**_spec_view(spec), cluster=spec.get("cluster", {}), n_nodes=spec["n_nodes"],
                       n_slots=spec["n_slots"], critic_features=spec.get("critic_features", False))
    obs, act_space = layout.spaces()
    module = RLModuleSpec(module_class=MATModule, observation_space=obs, action_space=act_space,
                          model_config=spec["model_config"]).build()
    module.load_state_dict(torch.load(path / POLICY_WEIGHTS, map_location="cpu", weights_only=True))
    return module.eval()


def policy_env(path: str | Path) -> dict[str, Any]:
    """The env settings an exported policy was trained with, which the env it runs in
    must share: `predictor` (spec) and the `VIEW_OPTIONS` (observation layout).

    Raises if the predictor's files have changed since.
    """
    spec = _read_spec(Path(path))
    predictor, trained_with = spec["predictor"], spec.get("predictor_digest")
    if trained_with is not None and predictor_digest(predictor) != trained_with:
        raise ConfigError(f"{path}: the predictor {predictor} has changed since this policy was trained "
                          "(its files no longer match); retrain the policy or restore that predictor")
    return {"predictor": predictor, "cluster": asdict(ClusterConfig(**spec.get("cluster", {}))), **_spec_view(spec)}


def act(module: MATModule, obs: dict[str, np.ndarray]) -> np.ndarray:
    """Greedy joint action(s) for one observation (N,) or a stacked batch (B, N)."""
    single = np.ndim(obs["slot_mask"]) == 1
    batch = {k: torch.as_tensor(np.asarray(v)) for k, v in obs.items()}
    if single:
        batch = {k: v.unsqueeze(0) for k, v in batch.items()}
    with torch.inference_mode():
        actions = module.forward_inference({Columns.OBS: batch})[Columns.ACTIONS].numpy()
    return actions[0] if single else actions
