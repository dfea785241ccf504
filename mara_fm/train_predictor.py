"""Train, tune and export the FM predictor (stage one).

`train_predictor` builds the bank if it is missing, trains with Lightning
(checkpoint every epoch, resume from `last.ckpt`), keeps the checkpoint with
the best ID-val capped MAE, chooses the sampling settings (M, Euler steps) on
ID val, exports the predictor and records everything in the MLflow
experiment `mara-predictor` (the run id is kept in the output folder, so a
resumed training continues the same MLflow run; under a store that does not
hold it, a new run names the one it continues).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from mara_common.config import ConfigError
from mara_common.paths import normal_path
from mara_common.profile import Profile
from mara_common.threads import torch_threads
from mara_common.tracking import mlflow_run
from mara_fm.bank import bank_digest
from mara_fm.build_bank import BankConfig, ensure_bank, ensure_wide_bank
from mara_fm.eval_predictor import Queries, score
from mara_fm.fm_data import FMDataModule
from mara_fm.fm_lightning import FMLightning
from mara_fm.fm_model import PredictorConfig
from mara_fm.predictors import FMPredictor, save_memory

EXPERIMENT = "mara-predictor"
INPUTS_FILE = "inputs.json"  # what the checkpoints were trained on; a resume must match it


@dataclass
class TrainResult:
    predictor_path: Path
    history: list[dict[str, float]]  # per epoch trained in this call
    constant_val: dict  # val metrics of the constant-demand baseline
    sampling: list[dict]  # the ID-val sweep over (samples, euler_steps)
    seconds: float
    run_id: str


class EpochReport(Callback):
    """Per-epoch metrics to MLflow and a progress line every `every_s` seconds."""

    def __init__(self, every_s: float, verbose: bool) -> None:
        self.every_s, self.verbose = every_s, verbose
        self.history: list[dict[str, float]] = []
        self._start = self._last = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        import mlflow

        row = {k: float(v) for k, v in trainer.callback_metrics.items()}
        row["epoch"] = trainer.current_epoch
        self.history.append(row)
        mlflow.log_metrics({k.replace("/", "_"): v for k, v in row.items() if k != "epoch"},
                           step=trainer.current_epoch)
        now = time.perf_counter()
        last_epoch = trainer.current_epoch + 1 >= trainer.max_epochs
        if self.verbose and (now - self._last >= self.every_s or last_epoch):
            self._last = now
            print(f"[train-predictor] epoch {trainer.current_epoch + 1}/{trainer.max_epochs} "
                  f"train {row.get('train/loss', np.nan):.4f} val {row.get('val/loss', np.nan):.4f} "
                  f"val MAE {row.get('val/mae', np.nan):.2f} ({now - self._start:.0f}s)", flush=True)


def tune_sampling(predictor: FMPredictor, queries: Queries, cfg: PredictorConfig) -> list[dict]:
    """Pick (M, Euler steps) on ID val: the cheapest setting within `sampling_tolerance` of the best MAE.

    Leaves `predictor` set to the choice; returns the sweep with the choice marked.
    """
    sweep = []
    for m in cfg.sample_choices:
        for steps in cfg.step_choices:
            predictor.set_sampling(m, steps)
            pred = predictor.remaining_batches(queries.hist, queries.eps, queries.horizon)
            sweep.append({"samples": m, "euler_steps": steps, **score(pred, queries)})
    best = min(r["capped_mae"] for r in sweep)
    ok = [r for r in sweep if r["capped_mae"] <= best * (1 + cfg.sampling_tolerance)]
    choice = min(ok, key=lambda r: (r["samples"] * r["euler_steps"], r["capped_mae"]))
    for r in sweep:
        r["chosen"] = r is choice
    predictor.set_sampling(choice["samples"], choice["euler_steps"])
    return sweep


def train_predictor(profile: Profile | str = "default", bank_path: str | Path | None = None,
                    out_dir: str | Path | None = None, resume: bool = True,
                    verbose: bool = True, report_every_s: float = 30.0, threads: int = 1,
                    **overrides: object) -> TrainResult:
    """Train the FM predictor of `profile`; `overrides` replace [predictor] keys (None = keep).

    `threads`: torch intra-op threads while training (see `torch_threads`).
    """
    with torch_threads(threads):
        return _train(Profile.load(profile), bank_path, out_dir, resume, verbose, report_every_s, overrides)


def check_inputs(out_dir: Path, inputs: dict) -> None:
    """Refuse to resume a training run whose bank or settings have changed since: its
    checkpoint was fitted to other data (and normalised with other statistics)."""
    stored_file = out_dir / INPUTS_FILE
    if not (out_dir / "checkpoints").exists():
        return
    stored = json.loads(stored_file.read_text()) if stored_file.exists() else None
    if stored is not None and isinstance(stored.get("config"), dict):
        # A setting added to PredictorConfig since the run was recorded, at its default, changes nothing.
        defaults = json.loads(json.dumps(asdict(PredictorConfig())))
        added = {k: defaults[k] for k in inputs["config"] if k not in stored["config"] and k in defaults}
        stored = {**stored, "config": {**stored["config"], **added}}
    if stored != inputs:
        changed = sorted(k for k in inputs if (stored or {}).get(k) != inputs[k]) if stored else ["unrecorded"]
        if "config" in changed and isinstance(stored.get("config"), dict):  # name the settings
            changed.remove("config")
            changed += sorted(f"config.{k}" for k in inputs["config"] if stored["config"].get(k) != inputs["config"][k])
        raise ConfigError(f"{out_dir} holds a predictor training run with other inputs "
                          f"({', '.join(changed)}): pass --fresh to start over, or another --out")


def _train(profile: Profile, bank_path: str | Path | None, out_dir: str | Path | None, resume: bool,
           verbose: bool, report_every_s: float, overrides: dict) -> TrainResult:
    start = time.perf_counter()
    cfg = profile.section(PredictorConfig, "predictor", **overrides)
    bank_path = Path(bank_path) if bank_path else profile.paths.bank
    ensure_bank(profile.section(BankConfig, "bank"), bank_path, progress=verbose)
    wide_bank = ensure_wide_bank(profile, progress=verbose) if cfg.wide_families else None
    out_dir = Path(out_dir) if out_dir else profile.paths.predictor_run
    ckpt_dir, run_file = out_dir / "checkpoints", out_dir / "mlflow_run_id"
    last = ckpt_dir / "last.ckpt"
    if not resume:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
    # Training longer is a resume, and the backend a loaded predictor runs on is not an input
    # of training; anything else the checkpoint was fitted to must match.
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("max_epochs", "inference")}
    inputs = {"bank": normal_path(bank_path), "bank_digest": bank_digest(bank_path),
              "config": json.loads(json.dumps(settings))}
    if wide_bank is not None:
        inputs["wide_bank_digest"] = bank_digest(wide_bank)
    check_inputs(out_dir, inputs)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / INPUTS_FILE).write_text(json.dumps(inputs, indent=1))
    resuming = last.exists()
    L.seed_everything(cfg.seed, verbose=False)
    data = FMDataModule(cfg, bank_path, wide_bank_path=wide_bank)
    data.setup()
    module = FMLightning(cfg, data.stats)
    run_id = run_file.read_text().strip() if resuming and run_file.exists() else None
    tags = {"stage": "train", "profile": profile.name, "bank": str(bank_path)}
    with mlflow_run(EXPERIMENT, run_name=f"train-predictor-{profile.name}", tags=tags,
                    run_id=run_id) as run:
        import mlflow

        out_dir.mkdir(parents=True, exist_ok=True)
        run_file.write_text(run.info.run_id)
        if run.info.run_id != run_id:  # a new run (under another store too, see `mlflow_run`)
            mlflow.log_params({**asdict(cfg), "bank": str(bank_path), "profile": profile.name})
            mlflow.log_metrics({f"constant_val_{k}": v for k, v in data.constant_val.items()
                                if k in ("capped_mae", "budget_accuracy")})
        # Saved at the end of each training epoch (after validation), so a resume starts a new epoch.
        checkpoint = ModelCheckpoint(dirpath=ckpt_dir, filename="best", monitor="val/mae", mode="min",
                                     enable_version_counter=False, save_on_train_epoch_end=True)
        latest = ModelCheckpoint(dirpath=ckpt_dir, filename=last.stem, enable_version_counter=False,
                                 save_on_train_epoch_end=True)
        report = EpochReport(report_every_s, verbose)
        trainer = L.Trainer(
            max_epochs=cfg.max_epochs, accelerator="auto", devices=1, logger=False,
            callbacks=[checkpoint, latest, report], reload_dataloaders_every_n_epochs=1,
            gradient_clip_val=cfg.grad_clip, num_sanity_val_steps=0,
            enable_progress_bar=False, enable_model_summary=False,
        )
        trainer.fit(module, datamodule=data, ckpt_path=last if resuming else None)
        best = Path(checkpoint.best_model_path) if checkpoint.best_model_path else last
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        module.model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
        predictor = FMPredictor(module.model.cpu().eval(), cfg, data.stats)
        sweep = tune_sampling(predictor, data.val_queries, cfg)
        path = predictor.export(out_dir / "predictor")
        save_memory(data.train, path)  # the recall predictor's memory (docs/design.md §5.6)
        mlflow.set_tags({"samples": predictor.cfg.samples, "euler_steps": predictor.cfg.euler_steps,
                         "best_checkpoint": best.name})
        chosen = next(r for r in sweep if r["chosen"])
        mlflow.log_metrics({"chosen_val_mae": chosen["capped_mae"],
                            "chosen_val_accuracy": chosen["budget_accuracy"],
                            "train_seconds": time.perf_counter() - start})
        mlflow.log_dict({"sweep": sweep}, "sampling_sweep.json")
        mlflow.log_artifacts(str(path), "predictor")
    if verbose:
        print(f"[train-predictor] exported {path} (M={predictor.cfg.samples}, "
              f"steps={predictor.cfg.euler_steps}, val MAE {chosen['capped_mae']:.2f} vs constant "
              f"{data.constant_val['capped_mae']:.2f}) in {time.perf_counter() - start:.0f}s", flush=True)
    return TrainResult(path, report.history, data.constant_val, sweep,
                       time.perf_counter() - start, run.info.run_id)
