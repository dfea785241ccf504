"""Stage two's world: the multi-node simulator, workloads and classic allocators."""

from gymnasium.envs.registration import register, registry

from mara_env.env import EnvConfig, MultiNodeEnv

ENV_ID = "mara_env/MultiNode-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="mara_env.env:MultiNodeEnv",
             vector_entry_point="mara_env.vector:PooledVectorEnv", disable_env_checker=True)

__all__ = ["ENV_ID", "EnvConfig", "MultiNodeEnv"]
