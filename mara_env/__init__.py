"""Stage two's world: the multi-node simulator, workloads and classic allocators."""

import gymnasium
from gymnasium.envs.registration import register

from mara_env.env import EnvConfig, MultiNodeEnv

ENV_ID = "mara_env/MultiNode-v0"

if ENV_ID not in gymnasium.registry:  # (`mara_env.registry` is the allocators' own)
    register(id=ENV_ID, entry_point="mara_env.env:MultiNodeEnv",
             vector_entry_point="mara_env.vector:PooledVectorEnv", disable_env_checker=True)

__all__ = ["ENV_ID", "EnvConfig", "MultiNodeEnv"]
