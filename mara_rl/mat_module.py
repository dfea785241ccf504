"""The MAT scheduler policy (docs/design.md §7) as an RLlib `TorchRLModule`.

An encoder attends over one token per task slot plus one token for the global
features; its outputs give a centralised value and per-slot representations.
A decoder then picks an action per node in fixed node order. Node i sees what
nodes 0..i-1 chose (their inputs are the chosen slots' representations, or a
learned idle embedding), so the joint policy factorises as
π(a|o) = Π_i π(a_i | a_<i, o). Slot scores are pointer-style (query of the
node · key of the slot), which keeps the policy equivariant to how tasks are
laid out in slots.

With the cluster options on (`EnvConfig.cluster`) the observation also has
per-node features (speed, restoring) and the slot each node served last:
node i's decoder input adds an embedding of its features and the
representation of that slot, so a node can tell the task it holds.

With the env's privileged critic features (`EnvConfig.critic_features`: each
task's true remaining demand and the demand still to arrive) the value comes
from a critic of its own, an encoder over the slots and those features: what
the simulator knows then lowers the variance of PPO's advantages (an
input-driven baseline), and nothing of it reaches the policy, which acts on
the observation alone (docs/design.md §7, "Privileged critic").

With the env's rule hint (`EnvConfig.rule_hint`: the joint action an allocator
would take in this state) each node's logit for the rule's choice gets a
learned bonus: a residual policy that starts at the rule, so PPO's updates are
departures from it rather than an imperfect copy of it (docs/design.md §7,
"Rule hint").

Because the decoder is causal, one teacher-forced pass over a stored joint
action reproduces exactly the per-node logits the sequential sampling loop
saw. `_forward_train` returns those logits flattened, and RLlib's
`TorchMultiCategorical` (one categorical per node) then yields
logp(a|o) = Σ_i log π(a_i | a_<i, o) inside the unmodified PPO loss.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import torch
import torch.nn.functional as F
from ray.rllib.core.columns import Columns
from ray.rllib.core.distribution.torch.torch_distribution import TorchMultiCategorical
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override
from torch import Tensor, nn

# Finite, so that entropies and KLs of masked distributions stay finite;
# exp() of it underflows to exactly 0, so masked actions are never sampled.
MASKED_LOGIT = -1e9


@dataclass
class MATConfig:
    """Network sizes; defaults follow the MAT reference (1 block, 1 head, 64 dims)."""

    embed_dim: int = 64
    n_heads: int = 1
    n_blocks: int = 1
    ff_dim: int = 64
    # Mask "idle" for a node while some present slot is still untaken. In this simulator
    # serving a task costs nothing, so idling beside a waiting task never helps. With node
    # features (the cluster options), a node may idle while the nodes after it can still take
    # every untaken slot: which nodes idle matters when speeds differ and tasks keep their node.
    work_conserving: bool = False
    # With the env's rule hint (`EnvConfig.rule_hint`): the starting value of the learned bonus on
    # each node's logit for the rule's choice. At 4 the rule's pick takes about 9 in 10 of a
    # node's probability among 8 even choices, so sampling starts at the rule, not at uniform.
    rule_bias_init: float = 4.0

    @classmethod
    def from_model_config(cls, model_config: dict[str, Any] | None) -> MATConfig:
        """Pick our keys out of RLlib's model_config (which merges in its own defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (model_config or {}).items() if k in names})


class _Attention(nn.Module):
    """Multi-head attention; `mask` is boolean, True = may attend."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"embed_dim {dim} is not divisible by n_heads {heads}")
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, context: Tensor, mask: Tensor | None) -> Tensor:
        return self.attend(x, *self.keys_values(context), mask)

    def keys_values(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head keys and values of `context`, each (B, heads, L, D/heads)."""
        b, lk, d = context.shape
        k, v = self.key_value(context).view(b, lk, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return k, v

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        b, lq, d = x.shape
        q = self.query(x).view(b, lq, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.unsqueeze(1))
        return self.out(y.transpose(1, 2).reshape(b, lq, d))


class _Block(nn.Module):
    """Post-LayerNorm Transformer block: self-attention, optional cross-attention, MLP."""

    def __init__(self, cfg: MATConfig, cross: bool) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.self_attn = _Attention(d, cfg.n_heads)
        self.norm_self = nn.LayerNorm(d)
        self.cross_attn = _Attention(d, cfg.n_heads) if cross else None
        self.norm_cross = nn.LayerNorm(d) if cross else None
        self.mlp = nn.Sequential(nn.Linear(d, cfg.ff_dim), nn.GELU(), nn.Linear(cfg.ff_dim, d))
        self.norm_mlp = nn.LayerNorm(d)

    def forward(self, x: Tensor, self_mask: Tensor, context: Tensor | None = None,
                context_mask: Tensor | None = None) -> Tensor:
        x = self.norm_self(x + self.self_attn(x, x, self_mask))
        if self.cross_attn is not None:
            x = self.norm_cross(x + self.cross_attn(x, context, context_mask))
        return self.norm_mlp(x + self.mlp(x))

    def step(self, x: Tensor, cache: tuple[Tensor, Tensor] | None, context_kv: tuple[Tensor, Tensor],
             context_mask: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The next position (B, 1, D) of a causal decoder block, given the keys and values
        of the positions before it (`cache`); returns its output and the grown cache."""
        k, v = self.self_attn.keys_values(x)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        x = self.norm_self(x + self.self_attn.attend(x, k, v, None))
        x = self.norm_cross(x + self.cross_attn.attend(x, *context_kv, context_mask))
        return self.norm_mlp(x + self.mlp(x)), (k, v)


def _encode_tokens(global_embed: nn.Module, slot_embed: nn.Module, blocks: nn.ModuleList, glob: Tensor,
                   slots: Tensor, present: Tensor) -> tuple[Tensor, Tensor]:
    """Token representations (B, 1+K, D), global token first, and which tokens exist. The global
    token is always attendable, so no attention row is fully masked."""
    tokens = torch.cat([global_embed(glob).unsqueeze(1), slot_embed(slots)], dim=1)
    exists = torch.cat([torch.ones_like(present[:, :1]), present], dim=1)
    for block in blocks:
        tokens = block(tokens, exists.unsqueeze(1))
    return tokens, exists


class _PrivilegedCritic(nn.Module):
    """The value of a state from the observation plus what only the simulator knows: one
    encoder over slot tokens (slot features + `critic_slots`) and a global token (globals +
    `critic_globals`), pooled, then an MLP."""

    def __init__(self, cfg: MATConfig, slot_features: int, global_features: int) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.slot_embed = nn.Sequential(nn.Linear(slot_features, d), nn.GELU())
        self.global_embed = nn.Sequential(nn.Linear(global_features, d), nn.GELU())
        self.encoder = nn.ModuleList(_Block(cfg, cross=False) for _ in range(cfg.n_blocks))
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))

    def forward(self, obs: dict[str, Tensor]) -> Tensor:
        slots = torch.cat([obs["slots"].float(), obs["critic_slots"].float()], dim=-1)
        glob = torch.cat([obs["globals"].float(), obs["critic_globals"].float()], dim=-1)
        tokens, exists = _encode_tokens(self.global_embed, self.slot_embed, self.encoder, glob, slots,
                                        obs["slot_mask"] > 0)
        return self.head(MATModule._pool(tokens, exists)).squeeze(-1)


class MATModule(TorchRLModule, ValueFunctionAPI):
    """Encoder over slots, autoregressive decoder over nodes, pooled value head.

    Observation: Dict(slots (K, F), globals (G,), slot_mask (K,)[, nodes (N, F_node),
    node_last (N,)][, critic_slots (K, 2), critic_globals (5,)][, rule_action (N,)]); action: MultiDiscrete([K+1] * N), 0 = idle, j = slot j-1.
    """

    @override(RLModule)
    def setup(self) -> None:
        super().setup()
        obs, act = self.observation_space, self.action_space
        if not isinstance(obs, gym.spaces.Dict) or not {"slots", "globals", "slot_mask"} <= set(obs):
            raise ValueError(f"MATModule needs Dict(slots, globals, slot_mask), got {obs}")
        self.n_slots, slot_features = obs["slots"].shape
        if not isinstance(act, gym.spaces.MultiDiscrete) or set(act.nvec.tolist()) != {self.n_slots + 1}:
            raise ValueError(f"MATModule needs MultiDiscrete([{self.n_slots + 1}] * N), got {act}")
        self.n_nodes = len(act.nvec)
        self.cfg = MATConfig.from_model_config(self.model_config)
        d = self.cfg.embed_dim

        self.slot_embed = nn.Sequential(nn.Linear(slot_features, d), nn.GELU())
        self.global_embed = nn.Sequential(nn.Linear(obs["globals"].shape[0], d), nn.GELU())
        self.encoder = nn.ModuleList(_Block(self.cfg, cross=False) for _ in range(self.cfg.n_blocks))
        privileged = "critic_slots" in obs.spaces
        self.critic = (_PrivilegedCritic(self.cfg, slot_features + obs["critic_slots"].shape[1],
                                         obs["globals"].shape[0] + obs["critic_globals"].shape[0])
                       if privileged else None)
        self.value_head = None if privileged else nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))

        self.start_token = nn.Parameter(torch.randn(d) * 0.02)
        self.idle_embed = nn.Parameter(torch.randn(d) * 0.02)
        self.node_pos = nn.Parameter(torch.randn(self.n_nodes, d) * 0.02)
        self.node_embed = nn.Linear(obs["nodes"].shape[1], d) if "nodes" in obs.spaces else None
        # With node features: a learned bonus on each node's logit for the slot it served last,
        # so keeping a task where it runs (no restore) is the easy default to learn.
        self.keep_bias = nn.Parameter(torch.zeros(1)) if self.node_embed is not None else None
        self.rule_bias = (nn.Parameter(torch.full((1,), self.cfg.rule_bias_init))
                          if "rule_action" in obs.spaces else None)
        self.decoder = nn.ModuleList(_Block(self.cfg, cross=True) for _ in range(self.cfg.n_blocks))
        self.pointer_query = nn.Linear(d, d)
        self.pointer_key = nn.Linear(d, d)
        causal = torch.ones(self.n_nodes, self.n_nodes, dtype=torch.bool).tril()
        self.register_buffer("causal_mask", causal, persistent=False)
        self._dist_cls = TorchMultiCategorical.get_partial_dist_cls(
            input_lens=[self.n_slots + 1] * self.n_nodes)

    @override(TorchRLModule)
    def get_inference_action_dist_cls(self) -> type[TorchMultiCategorical]:
        # Exploration and train classes default to this one in TorchRLModule.
        return self._dist_cls

    # ---- network pieces -------------------------------------------------
    def _encode(self, obs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Token representations (B, 1+K, D), global token first, and which tokens exist."""
        return _encode_tokens(self.global_embed, self.slot_embed, self.encoder, obs["globals"].float(),
                              obs["slots"].float(), obs["slot_mask"] > 0)

    def _node_inputs(self, obs: dict[str, Tensor], choices: Tensor) -> Tensor:
        """What each node adds to its decoder input (B, N, D): its position, and with node
        features their embedding plus the representation of the slot it served last."""
        if self.node_embed is None:
            return self.node_pos.expand(choices.shape[0], -1, -1)
        held = torch.gather(choices, 1, obs["node_last"].long()[..., None].expand(-1, -1, choices.shape[-1]))
        return self.node_pos + self.node_embed(obs["nodes"].float()) + held

    def _idle_allowed(self, untaken: Tensor, node: Tensor | int) -> Tensor:
        """Work conservation for node(s) `node` given the count of present slots still untaken:
        none left, or (with node features) no more than the nodes after it."""
        after = 0 if self.node_embed is None else self.n_nodes - 1 - node
        return untaken <= (after if isinstance(after, int) else after.to(untaken.device))

    def _bonus(self, obs: dict[str, Tensor], node: slice | int = slice(None)) -> Tensor | float:
        """The learned logit bonuses of each node (B, N, K+1), or of one node (B, K+1): `keep_bias`
        on the slot it served last (none for a node that held nothing) and `rule_bias` on the
        rule hint's choice; 0 without node features and hint."""
        bonus: Tensor | float = 0.0
        if self.keep_bias is not None:
            held = F.one_hot(obs["node_last"].long()[:, node], self.n_slots + 1).to(self.keep_bias.dtype)
            held[..., 0] = 0.0  # holding nothing is no reason to idle
            bonus = bonus + self.keep_bias * held
        if self.rule_bias is not None:
            hinted = F.one_hot(obs["rule_action"].long()[:, node], self.n_slots + 1).to(self.rule_bias.dtype)
            bonus = bonus + self.rule_bias * hinted
        return bonus

    @staticmethod
    def _pool(tokens: Tensor, exists: Tensor) -> Tensor:
        weights = exists.unsqueeze(-1).to(tokens.dtype)
        return (tokens * weights).sum(1) / weights.sum(1)

    def _decode(self, obs: dict[str, Tensor], tokens: Tensor, exists: Tensor, actions: Tensor) -> Tensor:
        """Masked logits (B, N, K+1) of each node given the earlier nodes' `actions`.

        Row i depends on actions[:, :i] only (causal), so this one function
        serves both the teacher-forced pass and each step of sampling.
        """
        b = tokens.shape[0]
        choices = torch.cat([self.idle_embed.expand(b, 1, -1), tokens[:, 1:]], dim=1)
        previous = torch.gather(choices, 1, actions[:, :-1, None].expand(-1, -1, choices.shape[-1]))
        x = torch.cat([self.start_token.expand(b, 1, -1), previous], dim=1) + self._node_inputs(obs, choices)
        for block in self.decoder:
            x = block(x, self.causal_mask.unsqueeze(0), tokens, exists.unsqueeze(1))
        logits = self.pointer_query(x) @ self.pointer_key(choices).transpose(1, 2)
        logits = logits / math.sqrt(x.shape[-1]) + self._bonus(obs)

        chosen = F.one_hot(actions, self.n_slots + 1)
        taken_before = (chosen.cumsum(1) - chosen) > 0
        taken_before[..., 0] = False  # idle is not exclusive
        allowed = exists.unsqueeze(1) & ~taken_before  # exists[:, 0] doubles as "idle allowed"
        if self.cfg.work_conserving:
            allowed[..., 0] = self._idle_allowed(allowed[..., 1:].sum(-1), torch.arange(self.n_nodes))
        return logits.masked_fill(~allowed, MASKED_LOGIT)

    def _sample(self, obs: dict[str, Tensor], greedy: bool) -> dict[str, Tensor]:
        """Sequential decoding, one node at a time, with cached keys and values.

        Computes the same logits as `_decode` on the final actions (tested), but
        each step runs the decoder on the new node only: what the earlier nodes
        and the encoder contribute is computed once.
        """
        tokens, exists = self._encode(obs)
        b, d = tokens.shape[0], tokens.shape[-1]
        choices = torch.cat([self.idle_embed.expand(b, 1, -1), tokens[:, 1:]], dim=1)
        keys = self.pointer_key(choices).transpose(1, 2) / math.sqrt(d)
        context_kv = [block.cross_attn.keys_values(tokens) for block in self.decoder]
        context_mask = exists.unsqueeze(1)
        node_inputs = self._node_inputs(obs, choices)
        caches: list[tuple[Tensor, Tensor] | None] = [None] * len(self.decoder)
        allowed = exists.clone()  # exists[:, 0] doubles as "idle allowed"
        x = self.start_token.expand(b, 1, -1)
        actions, rows = [], []
        for i in range(self.n_nodes):
            x = x + node_inputs[:, i:i + 1]
            for j, block in enumerate(self.decoder):
                x, caches[j] = block.step(x, caches[j], context_kv[j], context_mask)
            if self.cfg.work_conserving:
                allowed[:, 0] = self._idle_allowed(allowed[:, 1:].sum(-1), i)
            logits_i = ((self.pointer_query(x) @ keys).squeeze(1) + self._bonus(obs, i)).masked_fill(
                ~allowed, MASKED_LOGIT)
            if greedy:
                a = logits_i.argmax(-1)
            else:
                a = torch.distributions.Categorical(logits=logits_i).sample()
            allowed = allowed.scatter(1, a[:, None], False)
            allowed[:, 0] = True  # idle is not exclusive (work conservation is re-checked per node)
            x = choices[torch.arange(b, device=a.device), a].unsqueeze(1)
            actions.append(a)
            rows.append(logits_i)
        actions_t, logits = torch.stack(actions, dim=1), torch.stack(rows, dim=1)
        logp = F.log_softmax(logits, -1).gather(-1, actions_t.unsqueeze(-1)).squeeze(-1).sum(-1)
        return {Columns.ACTIONS: actions_t, Columns.ACTION_LOGP: logp,
                Columns.ACTION_DIST_INPUTS: logits.flatten(1)}

    # ---- RLlib forward passes -------------------------------------------
    @override(TorchRLModule)
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Tensor]:
        with torch.no_grad():
            return self._sample(batch[Columns.OBS], greedy=True)

    @override(TorchRLModule)
    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Tensor]:
        with torch.no_grad():
            return self._sample(batch[Columns.OBS], greedy=False)

    @override(RLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Tensor]:
        tokens, exists = self._encode(batch[Columns.OBS])
        logits = self._decode(batch[Columns.OBS], tokens, exists, batch[Columns.ACTIONS].long())
        out = {Columns.ACTION_DIST_INPUTS: logits.flatten(1)}
        if self.critic is None:  # the value head shares the policy's encoder
            out[Columns.EMBEDDINGS] = self._pool(tokens, exists)
        return out

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict[str, Any], embeddings: Tensor | None = None) -> Tensor:
        if self.critic is not None:
            return self.critic(batch[Columns.OBS])
        if embeddings is None:
            embeddings = self._pool(*self._encode(batch[Columns.OBS]))
        return self.value_head(embeddings).squeeze(-1)
