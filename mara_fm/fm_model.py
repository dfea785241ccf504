"""The FM predictor's network (docs/design.md §5.1), plain PyTorch.

history points ─GRU─> h ─┐
static features ─────────┴─MLP─> context c
v_θ(z_u, u, c) = MLP(W_z z_u + W_u emb(u) + W_c c + b)   (one linear layer on
the concatenation, written split so the sampler computes the (u, c) part once
per call instead of once per sample and step).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from mara_fm.targets import history_width, static_width

PRIOR_MODES = ("off", "pretrain", "mixture")
INFERENCE_BACKENDS = ("torch", "numpy")


@dataclass(frozen=True)
class PredictorConfig:
    """Every hyper-parameter of the FM predictor: encoding, network, training, sampling."""

    seed: int = 0
    # targets and history encoding (targets.py)
    n_boundaries: int = 32  # H
    delta: float = 1e-8
    max_points: int = 12  # GRU steps at most (history thinning, see targets.py)
    recent_points: int = 6  # latest points always kept
    # W > 0: a 5th per-point feature, the mean per-batch loss since the previous kept point (at
    # least the last W batches) over L_cur (targets.history_features). 0: the four of §5.1.
    interval_window: int = 0
    # Whether the context reads log lr beside log B, log L_cur and log h (targets.static_features).
    # A learning rate's scale depends on the optimiser and the model, so across job kinds it may
    # say more about which family a run is than about how its loss will fall.
    lr_input: bool = True
    # network
    # Chosen by family-held-out validation (experiments/probes/select_predictor.py) and the
    # teacher on unseen families (unseen_families_probe.py): trained on the ID families
    # alone, larger networks forecast unseen families worse; with the prior and the wide
    # families 64/96/128 forecast them 8% better, but the teacher gained nothing from it
    # (docs/decisions.md, "Predictor"). Small also keeps a simulator step cheap.
    gru_hidden: int = 16
    context_dim: int = 24
    width: int = 32  # velocity MLP
    depth: int = 1  # hidden layers of the velocity MLP after the input layer
    time_dim: int = 32
    # training examples (fm_data.py)
    examples_per_curve: int = 48  # fresh random (prefix, horizon) pairs per train curve per epoch
    val_examples_per_curve: int = 16  # fixed ones per val curve
    stats_examples_per_curve: int = 64
    short_prefix_prob: float = 0.5  # share of examples with a log-uniform prefix length
    min_horizon: int = 8  # batches
    full_horizon_prob: float = 0.5  # share of examples whose horizon is the rest of the curve
    # Augmentation (fm_data.wobble): each epoch, this share of train curves has its per-batch
    # losses multiplied by a smooth random factor exp(σ·z), z a unit-variance AR(1) process with
    # correlation length `augment_length` batches, so cumulative averages sometimes rise for a
    # while (every ID family decreases almost monotonically; RL TD losses do not). 0 = off.
    augment_prob: float = 0.0
    augment_sigma: float = 0.5
    augment_length: float = 30.0
    # Family-held-out validation, for choosing capacity and training length: these ID
    # families' train and val curves become the validation set and leave training, so
    # val MAE measures forecasts for families the network never saw (what RL OOD and ViT
    # OOD ask of it). Empty (the default) = validate on ID val curves of every family.
    heldout_families: tuple[str, ...] = ()
    # Train (and validate) on the wide bank's eight extra families too (wide_families.py),
    # beside the ID ones; `heldout_families` may then name wide families.
    wide_families: bool = False
    # The synthetic curve prior (curve_prior.py): "off"; "pretrain" (the first `prior_epochs`
    # epochs on `prior_curves` synthetic curves only, then the real ones); "mixture" (every
    # epoch on the real train curves and the synthetic ones together). Standardisation
    # statistics always come from the real train curves.
    prior: str = "off"
    prior_curves: int = 2000
    prior_epochs: int = 10
    # optimisation (fm_lightning.py)
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    max_epochs: int = 100
    grad_clip: float = 1.0
    # sampling (predictors/fm.py); train_predictor picks (samples, euler_steps) on ID val
    samples: int = 8  # M
    euler_steps: int = 4
    sampler_seed: int = 0
    sample_choices: tuple[int, ...] = (8, 16)
    step_choices: tuple[int, ...] = (1, 2, 4)
    sampling_tolerance: float = 0.02  # take the cheapest setting within 2% of the best val MAE
    # How a loaded (frozen) predictor runs the network: "torch", or "numpy" (fm_numpy.py: the
    # same network, faster at the simulator's few prefixes per call, equal to about 1e-6).
    inference: str = "torch"

    def __post_init__(self) -> None:
        if isinstance(self.heldout_families, str):
            raise ValueError("PredictorConfig.heldout_families must be a list of family names, "
                             f"got the string {self.heldout_families!r}")
        object.__setattr__(self, "heldout_families", tuple(self.heldout_families))
        counts = ("n_boundaries", "max_points", "recent_points", "gru_hidden", "context_dim", "width",
                  "time_dim", "examples_per_curve", "val_examples_per_curve", "stats_examples_per_curve",
                  "min_horizon", "batch_size", "max_epochs", "samples", "euler_steps")
        for name in counts:
            if getattr(self, name) < 1:
                raise ValueError(f"PredictorConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.depth < 0 or self.lr <= 0 or self.weight_decay < 0 or self.grad_clip <= 0:
            raise ValueError("PredictorConfig needs depth >= 0, lr > 0, weight_decay >= 0 and grad_clip > 0")
        for name in ("short_prefix_prob", "full_horizon_prob", "sampling_tolerance"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PredictorConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("sample_choices", "step_choices"):
            if not getattr(self, name) or min(getattr(self, name)) < 1:
                raise ValueError(f"PredictorConfig.{name} must list counts >= 1, got {getattr(self, name)}")
        if self.inference not in INFERENCE_BACKENDS:
            raise ValueError(f"PredictorConfig.inference must be one of {list(INFERENCE_BACKENDS)}, "
                             f"got {self.inference!r}")
        if self.prior not in PRIOR_MODES:
            raise ValueError(f"PredictorConfig.prior must be one of {list(PRIOR_MODES)}, got {self.prior!r}")
        if self.prior_curves < 1 or self.prior_epochs < 0:
            raise ValueError("PredictorConfig.prior_curves must be >= 1 and prior_epochs >= 0, got "
                             f"{self.prior_curves} and {self.prior_epochs}")
        if not 0.0 <= self.augment_prob <= 1.0:
            raise ValueError(f"PredictorConfig.augment_prob must be in [0, 1], got {self.augment_prob}")
        if self.augment_sigma < 0 or self.augment_length <= 0:
            raise ValueError("PredictorConfig.augment_sigma must be ≥ 0 and augment_length > 0, got "
                             f"{self.augment_sigma} and {self.augment_length}")
        if self.interval_window < 0:
            raise ValueError(f"PredictorConfig.interval_window must be ≥ 0 (0 = off), got {self.interval_window}")


def time_frequencies(dim: int) -> torch.Tensor:
    """Frequencies of the sinusoidal embedding of u ∈ [0, 1], geometric over 1..1000."""
    return torch.exp(torch.linspace(0.0, math.log(1000.0), dim // 2))


class HistoryEncoder(nn.Module):
    """GRU over the per-point features; the state after the last real point."""

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        self.gru = nn.GRU(history_width(cfg.interval_window), cfg.gru_hidden, batch_first=True)

    def forward(self, points: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        # Right padding keeps the GRU causal, so the output at count-1 ignores the pad.
        out, _ = self.gru(points)
        return out[torch.arange(len(counts), device=out.device), counts - 1]


class VelocityField(nn.Module):
    """An MLP over [z, emb(u), c]; layers are applied with F.linear because at
    the simulator's batch sizes a module call costs more than its maths."""

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        self.register_buffer("freqs", time_frequencies(cfg.time_dim), persistent=False)
        self.z_in = nn.Linear(cfg.n_boundaries, cfg.width)
        self.u_in = nn.Linear(cfg.time_dim, cfg.width, bias=False)
        self.c_in = nn.Linear(cfg.context_dim, cfg.width, bias=False)
        self.hidden = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(cfg.depth))
        self.out = nn.Linear(cfg.width, cfg.n_boundaries)

    def condition(self, u: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """The (u, c) part of the first layer (with its bias); u and c broadcast together."""
        angles = u[..., None] * self.freqs
        emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
        return F.linear(emb, self.u_in.weight, self.z_in.bias) + F.linear(c, self.c_in.weight)

    def forward(self, z: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """z: (rows, H), cond: (rows, width) from `condition`."""
        h = torch.addmm(cond, z, self.z_in.weight.t())
        for layer in self.hidden:
            h = F.linear(F.silu(h), layer.weight, layer.bias)
        return F.linear(F.silu(h), self.out.weight, self.out.bias)


class FlowModel(nn.Module):
    """Conditional velocity field v_θ(z_u, u, c(history, static))."""

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        self.encoder = HistoryEncoder(cfg)
        self.context = nn.Sequential(
            nn.Linear(cfg.gru_hidden + static_width(cfg.lr_input), cfg.context_dim), nn.SiLU(),
            nn.Linear(cfg.context_dim, cfg.context_dim),
        )
        self.field = VelocityField(cfg)

    def encode(self, points: torch.Tensor, counts: torch.Tensor, static: torch.Tensor) -> torch.Tensor:
        return self.context(torch.cat([self.encoder(points, counts), static], dim=-1))

    def forward(self, z: torch.Tensor, u: torch.Tensor, points: torch.Tensor, counts: torch.Tensor,
                static: torch.Tensor) -> torch.Tensor:
        """Velocity at (z_u, u) for a batch of examples; u has shape (E,)."""
        c = self.encode(points, counts, static)
        return self.field(z, self.field.condition(u, c))

    def sample(self, c: torch.Tensor, z0: torch.Tensor, steps: int) -> torch.Tensor:
        """Euler integration of dz/du = v from u = 0 to 1.

        c: (E, context), z0: (M, H) shared starting points → (E, M, H). Rows
        are laid out flat (E·M, ·) since 2-D matmuls are the fast path on CPU.
        """
        n, m = c.shape[0], z0.shape[0]
        u = torch.arange(steps, device=c.device, dtype=c.dtype) / steps
        cond = self.field.condition(u[:, None], c[None]).repeat_interleave(m, dim=1)
        z = z0.repeat(n, 1)
        for k in range(steps):
            z = torch.add(z, self.field(z, cond[k]), alpha=1.0 / steps)
        return z.view(n, m, -1)
