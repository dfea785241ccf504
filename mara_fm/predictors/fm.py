"""The flow-matching predictor behind the common `Predictor` interface.

Inference is deterministic: the M starting points are fixed scrambled-Sobol
points mapped to Gaussians, drawn once per sampling setting, so the same
prefix gets the same answer in any process. An exported predictor is a folder
with `config.json` (config + training statistics) and `weights.pt` (a plain
state_dict, read with `weights_only=True`); loading needs neither Lightning
nor any training code. A loaded predictor runs its network with the backend its
config names (`PredictorConfig.inference`: torch, or NumPy via fm_numpy.py).
"""

from __future__ import annotations

import dataclasses
import json
from abc import abstractmethod
from pathlib import Path

import numpy as np
import torch

from mara_common.config import make_config
from mara_common.threads import blas_threads
from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.fm_numpy import NumpyFlow
from mara_fm.predictors.base import HistoryBatch, Predictor
from mara_fm.targets import (
    Stats,
    boundaries,
    crossing_batches,
    decode_targets,
    history_features,
    static_features,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"
FORMAT = "mara-fm-predictor/1"


class ArtifactError(ValueError):
    """An exported predictor that is missing or unreadable."""


def sobol_normals(samples: int, dim: int, seed: int) -> torch.Tensor:
    """`samples` fixed quasi-random N(0, I) points in `dim` dimensions."""
    engine = torch.quasirandom.SobolEngine(dim, scramble=True, seed=seed)
    u = engine.draw(samples, dtype=torch.float64).clamp(1e-6, 1 - 1e-6)
    return torch.special.ndtri(u).float()


def _median(ordered: np.ndarray) -> np.ndarray:
    """The median of rows already sorted, without np.median's overhead."""
    m = ordered.shape[1]
    return 0.5 * (ordered[:, (m - 1) // 2] + ordered[:, m // 2])


class SampledPredictor(Predictor):
    """A predictor that draws M crossings per task and reports their median (and, for an
    optimistic band, a low order statistic): FM, and combinations of FM networks such as
    the probes' ensembles."""

    name = "fm"

    @property
    @abstractmethod
    def samples(self) -> int:
        """M, the crossings drawn per task."""

    @abstractmethod
    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        """(B, M) the M sampled paths' remaining batches to `eps`, ascending."""

    @abstractmethod
    def resampled(self, sampler_seed: int) -> SampledPredictor:
        """The same networks with another fixed draw of their starting points: the draw moves
        what an allocator does about as much as the network does (docs/experiments.md, "Near
        predictors are ordered…"), so comparisons of predictors may average over draws."""

    def _predict(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        return _median(self.sorted_crossings(hist, eps, horizon))

    def _predict_band(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray,
                      quantile: float) -> np.ndarray:
        """The median and the order statistic round(q·(M−1)) of the M crossings
        (q = 0.15: the 2nd smallest of 8, the 3rd of 16)."""
        ordered = self.sorted_crossings(hist, eps, horizon)
        low = ordered[:, round(quantile * (ordered.shape[1] - 1))]
        return np.stack([_median(ordered), low], axis=1)


class FMPredictor(SampledPredictor):
    """Samples M future loss paths per prefix from the flow-matching network."""

    def __init__(self, model: FlowModel, cfg: PredictorConfig, stats: Stats) -> None:
        """With `cfg.inference = "numpy"` the network runs on a copy of `model`'s weights
        taken now, so a model still training must come with "torch"."""
        self.model = model
        self.cfg = cfg
        self.stats = stats
        self.numpy_flow = NumpyFlow(model) if cfg.inference == "numpy" else None
        self.set_sampling(cfg.samples, cfg.euler_steps)

    def set_sampling(self, samples: int, steps: int) -> None:
        """Choose M and the Euler step count; redraws the fixed starting points."""
        self.cfg = dataclasses.replace(self.cfg, samples=samples, euler_steps=steps)
        self._z0 = sobol_normals(samples, self.cfg.n_boundaries, self.cfg.sampler_seed)

    @property
    def samples(self) -> int:
        return self.cfg.samples

    def resampled(self, sampler_seed: int) -> FMPredictor:
        return FMPredictor(self.model, dataclasses.replace(self.cfg, sampler_seed=sampler_seed), self.stats)

    def encode(self, hist: HistoryBatch, horizon: np.ndarray) -> tuple[torch.Tensor, ...]:
        """Standardised model inputs (points, counts, static) for prefixes and horizons (batches)."""
        cfg, stats = self.cfg, self.stats
        points, counts = history_features(hist.avg, hist.lengths, hist.batch_size,
                                          cfg.max_points, cfg.recent_points, cfg.interval_window)
        # A zero horizon (a task at the end of its curve) is answered 0 by the clip; keep log h finite.
        h = np.maximum(horizon, 1.0) * hist.batch_size
        static = static_features(hist.batch_size, hist.lr if cfg.lr_input else None, hist.current, h)
        return (torch.from_numpy(stats.history.apply(points).astype(np.float32)),
                torch.from_numpy(counts),
                torch.from_numpy(stats.static.apply(static).astype(np.float32)))

    def forecast(self, hist: HistoryBatch, horizon: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Boundaries s (E, H+1) and sampled cumulative-average paths L̂ (E, M, H+1)."""
        inputs = self.encode(hist, horizon)
        if self.numpy_flow is not None:
            flow = self.numpy_flow
            with blas_threads(1):
                z = flow.sample(flow.encode(*(t.numpy() for t in inputs)), self._z0.numpy(), self.cfg.euler_steps)
        else:
            device = next(self.model.parameters()).device
            with torch.inference_mode():
                c = self.model.encode(*(t.to(device) for t in inputs))
                z = self.model.sample(c, self._z0.to(device), self.cfg.euler_steps).cpu().numpy()
        y = self.stats.target.invert(z.astype(np.float64))
        start = hist.lengths * hist.batch_size.astype(np.float64)
        h = horizon * hist.batch_size
        _, paths = decode_targets(y, hist.current, start, h, self.cfg.delta)
        return boundaries(start, h, self.cfg.n_boundaries), paths

    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        _, paths = self.forecast(hist, horizon)
        return np.sort(crossing_batches(paths, eps, horizon), axis=1)

    def export(self, path: str | Path) -> Path:
        """Write `config.json` and `weights.pt` into folder `path`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        torch.save(state, path / WEIGHTS_FILE)
        meta = {"format": FORMAT, "config": dataclasses.asdict(self.cfg), "stats": self.stats.to_json()}
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path, inference: str | None = None) -> FMPredictor:
        """Load an exported predictor folder, run by its config's backend unless `inference`
        names another; `ArtifactError` names the file at fault."""
        path = Path(path)
        cfg_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
        for f in (cfg_file, weights_file):
            if not f.is_file():
                raise ArtifactError(f"{f}: FM predictor file not found (export one with `mara train-predictor`)")
        try:
            meta = json.loads(cfg_file.read_text())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected {FORMAT!r}")
            values = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["config"].items()}
            cfg = make_config(PredictorConfig, values, where=str(cfg_file))
            stats = Stats.from_json(meta["stats"])
        except Exception as exc:
            raise ArtifactError(f"{cfg_file}: not a valid FM predictor config ({exc})") from exc
        model = FlowModel(cfg)
        try:
            state = torch.load(weights_file, map_location="cpu", weights_only=True)
            model.load_state_dict(state)
        except Exception as exc:
            raise ArtifactError(f"{weights_file}: unreadable or mismatched FM weights ({exc})") from exc
        broken = [name for name, tensor in state.items() if not torch.isfinite(tensor).all()]
        if broken:
            raise ArtifactError(f"{weights_file}: FM weights hold NaN or inf (in {broken[0]}); "
                                "retrain the predictor")
        return cls(model.eval(), dataclasses.replace(cfg, inference=inference or cfg.inference), stats)
