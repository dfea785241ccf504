"""RLlib's PPO loss plus a KL anchor to the warm-started policy.

A warm-started MAT begins as a close copy of LARA-FM. Plain PPO from there
drifts: with normalised advantages that are mostly noise, pushing down a
near-certain choice moves more probability than pushing it up can, so the
entropy climbs and the greedy policy loses what imitation taught (docs/history.md,
"Training recipes on the current workload"). The anchor adds, per sampled state,

    anchor_coeff · Σ_i KL( π_ref(· | s, a_<i) ‖ π(· | s, a_<i) ),

π_ref the frozen imitated policy, a_<i the stored joint action's earlier
nodes (the teacher-forced pass PPO already runs; summed over nodes it is the
chain-rule estimate of the joint KL on PPO's own states). Only changes that
the advantages support consistently outweigh it: the same device that keeps
a fine-tuned language model near its supervised start.

The reference is read from the exported warm-start policy in the run folder
(`warm_start_policy/`), lazily, so a resumed run anchors to the same policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.columns import Columns

from mara_rl.policy import load_policy

ANCHOR_KL = "anchor_kl"


class AnchoredPPOTorchLearner(PPOTorchLearner):
    """`PPOTorchLearner` whose loss also charges the KL to a frozen reference policy.

    Settings come from `learner_config_dict`: `anchor_coeff` (0 = plain PPO)
    and `anchor_policy` (an exported policy folder, see `load_policy`).
    """

    _reference: Any = None

    def reference(self) -> Any:
        if self._reference is None:
            path = Path(self.config.learner_config_dict["anchor_policy"])
            self._reference = load_policy(path).requires_grad_(False)
        return self._reference

    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict[str, Any],
                                fwd_out: dict[str, Any]) -> torch.Tensor:
        loss = super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        coeff = float(config.learner_config_dict.get("anchor_coeff", 0.0))
        if coeff <= 0:
            return loss
        module = self.module[module_id].unwrapped()
        with torch.no_grad():
            ref_logits = self.reference().forward_train(
                {Columns.OBS: batch[Columns.OBS], Columns.ACTIONS: batch[Columns.ACTIONS]}
            )[Columns.ACTION_DIST_INPUTS]
        shape = (-1, module.n_nodes, module.n_slots + 1)
        log_pi = F.log_softmax(fwd_out[Columns.ACTION_DIST_INPUTS].view(shape), -1)
        log_ref = F.log_softmax(ref_logits.view(shape), -1)
        kl = F.kl_div(log_pi, log_ref, log_target=True, reduction="none").sum((-1, -2))
        if Columns.LOSS_MASK in batch:
            mask = batch[Columns.LOSS_MASK]
            mean_kl = kl[mask].sum() / mask.sum()
        else:
            mean_kl = kl.mean()
        self.metrics.log_dict({ANCHOR_KL: mean_kl.detach()}, key=module_id, window=1)
        return loss + coeff * mean_kl
