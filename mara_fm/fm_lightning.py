"""Lightning wrapper: conditional flow matching on the linear path (docs/design.md §5.1).

Loss: z_u = (1 − u)·z_0 + u·z_1 with z_0 ~ N(0, I), u ~ U[0, 1], regress
v_θ(z_u, u, c) on z_1 − z_0 (mean squared error per coordinate). Validation
reports the same loss on fixed val examples and noise, and the capped MAE of
the full predictor (sampling + decoding) on the ID val queries, which is what
checkpoint selection uses.
"""

from __future__ import annotations

import dataclasses

import lightning as L
import torch
from torch.nn import functional as F

from mara_fm.eval_predictor import score
from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.predictors.fm import FMPredictor
from mara_fm.targets import Stats


class FMLightning(L.LightningModule):
    def __init__(self, cfg: PredictorConfig, stats: Stats) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = FlowModel(cfg)
        # Validation samples from the weights as they train: torch, whatever the export will use.
        self.predictor = FMPredictor(self.model, dataclasses.replace(cfg, inference="torch"), stats)

    def cfm_loss(self, points: torch.Tensor, counts: torch.Tensor, static: torch.Tensor,
                 z1: torch.Tensor, z0: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        zu = (1 - u[:, None]) * z0 + u[:, None] * z1
        return F.mse_loss(self.model(zu, u, points, counts, static), z1 - z0)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        points, counts, static, z1 = batch
        loss = self.cfm_loss(points, counts, static, z1, torch.randn_like(z1),
                             torch.rand(len(z1), device=z1.device))
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(z1))
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.cfm_loss(*batch), batch_size=len(batch[0]))

    def on_validation_epoch_end(self) -> None:
        q = self.trainer.datamodule.val_queries
        metrics = score(self.predictor.remaining_batches(q.hist, q.eps, q.horizon), q)
        self.log("val/mae", metrics["capped_mae"])
        self.log("val/accuracy", metrics["budget_accuracy"])

    def configure_optimizers(self) -> dict:
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.lr,
                                weight_decay=self.cfg.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(self.trainer.max_epochs, 1))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}
