"""Eight more families for the wide bank: predictor training and family-held-out validation only.

The ID families teach FM eight curve kinds; with so few, a network that fits them
closely forecasts unseen kinds worse (docs/decisions.md, "Predictor"). These families
widen what it learns from and, held out in turn, measure how it forecasts a kind it
never saw. They are never scored by the evaluation: their task set is `wide`, they
live in a bank file of their own (`data/banks/<profile>-wide.parquet`, profile
section `[wide_bank]`), and the ID, RL OOD and ViT OOD sets stay exactly as they were.

What they add to the ID families (docs/design.md §2.1):
- modalities: graphs (a GCN on a stochastic block model), recommendation (matrix
  factorisation), time-series forecasting, synthetic images, a digits autoencoder;
- optimisers: Adagrad, RMSprop and SGD with Nesterov momentum, beside Adam(W) and SGD;
- learning-rate schedules: step decay, cosine, linear warm-up, warm-up then cosine;
- a small causal transformer language model.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mara_fm.families import DATA_SEED, Family, _mlp, _sklearn_xy, _text_corpus
from mara_fm.jobs import LanguageModelJob, SupervisedJob, lr_schedule

WIDE = "wide"  # the task set of these families


def _standardised(x: np.ndarray) -> torch.Tensor:
    return torch.tensor((x - x.mean(0)) / (x.std(0) + 1e-8), dtype=torch.float32)


# ---------------------------------------------------------------- datasets (fixed DATA_SEED)


@functools.cache
def _moons() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import make_moons

    x, y = make_moons(2000, noise=0.3, random_state=DATA_SEED)
    return _standardised(x), torch.tensor(y, dtype=torch.long)


@functools.cache
def _friedman() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import make_friedman1

    x, y = make_friedman1(2000, n_features=10, noise=1.0, random_state=DATA_SEED)
    return _standardised(x), _standardised(y[:, None])[:, 0]


@functools.cache
def _ratings(users: int = 200, items: int = 150, rank: int = 4, n: int = 8000) -> tuple[torch.Tensor, torch.Tensor]:
    """Observed entries of a noisy low-rank user × item rating matrix: ((user, item), rating)."""
    rng = np.random.default_rng(DATA_SEED)
    u, v = rng.normal(0, 1, (users, rank)), rng.normal(0, 1, (items, rank))
    pairs = np.stack([rng.integers(0, users, n), rng.integers(0, items, n)], 1)
    rating = (u[pairs[:, 0]] * v[pairs[:, 1]]).sum(1) / np.sqrt(rank) + rng.normal(0, 0.3, n)
    return torch.tensor(pairs, dtype=torch.long), torch.tensor(rating, dtype=torch.float32)


@functools.cache
def _series(n: int = 3000, window: int = 32, ahead: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of seasonal series with AR(1) noise; the target is the next `ahead` values."""
    rng = np.random.default_rng(DATA_SEED)
    t = np.arange(window + ahead)
    period = rng.uniform(6, 24, (n, 1))
    seasonal = rng.uniform(0.5, 1.5, (n, 1)) * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi, (n, 1)))
    noise = np.zeros((n, window + ahead))
    for i in range(1, window + ahead):
        noise[:, i] = 0.8 * noise[:, i - 1] + rng.normal(0, 0.3, n)
    trend = rng.normal(0, 0.02, (n, 1)) * t
    x = seasonal + noise + trend
    return (torch.tensor(x[:, None, :window], dtype=torch.float32),
            torch.tensor(x[:, window:], dtype=torch.float32))


@functools.cache
def _shapes(n: int = 3000, size: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy images of a disc, a square or a cross at a random place and scale."""
    rng = np.random.default_rng(DATA_SEED)
    yy, xx = np.mgrid[:size, :size]
    y = rng.integers(0, 3, n)
    images = np.zeros((n, size, size))
    for i in range(n):
        r = rng.uniform(2, 4)
        cy, cx = rng.uniform(r, size - r, 2)
        dy, dx = np.abs(yy - cy), np.abs(xx - cx)
        mask = [dy**2 + dx**2 <= r**2, np.maximum(dy, dx) <= r * 0.8, (np.minimum(dy, dx) <= 0.8) & (np.maximum(dy, dx) <= r)][y[i]]
        images[i] = mask
    images += rng.normal(0, 0.5, images.shape)
    return torch.tensor(images[:, None], dtype=torch.float32), torch.tensor(y, dtype=torch.long)


@functools.cache
def _block_graph(nodes: int = 400, blocks: int = 4, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stochastic block model: (normalised adjacency with self-loops, node features, block labels).
    Features carry the block only weakly, so the edges are needed."""
    rng = np.random.default_rng(DATA_SEED)
    y = rng.integers(0, blocks, nodes)
    p = np.where(y[:, None] == y[None, :], 0.05, 0.01)
    a = np.triu(rng.random((nodes, nodes)) < p, 1)
    a = (a | a.T).astype(np.float64) + np.eye(nodes)
    d = 1 / np.sqrt(a.sum(1))
    centres = rng.normal(0, 1, (blocks, dim))
    x = 0.4 * centres[y] + rng.normal(0, 1, (nodes, dim))
    return (torch.tensor(d[:, None] * a * d[None, :], dtype=torch.float32), torch.tensor(x, dtype=torch.float32),
            torch.tensor(y, dtype=torch.long))


# ---------------------------------------------------------------- models and jobs


class _GCN(nn.Module):
    """Two graph convolutions over the whole graph; the input is a batch of node indices."""

    def __init__(self, adjacency: torch.Tensor, features: torch.Tensor, classes: int, hidden: int = 32) -> None:
        super().__init__()
        self.register_buffer("adjacency", adjacency)
        self.register_buffer("features", features)
        self.first, self.second = nn.Linear(features.shape[1], hidden), nn.Linear(hidden, classes)

    def forward(self, nodes: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.adjacency @ self.first(self.features))
        return (self.adjacency @ self.second(h))[nodes]


def _gcn_blocks(gen, batch_size, lr, planned):
    adjacency, features, labels = _block_graph()
    model = _GCN(adjacency, features, int(labels.max()) + 1)
    data = (torch.arange(len(labels)), labels)
    return SupervisedJob(data, model, F.cross_entropy, torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


class _Factorisation(nn.Module):
    def __init__(self, users: int, items: int, rank: int = 16) -> None:
        super().__init__()
        self.user, self.item = nn.Embedding(users, rank), nn.Embedding(items, rank)
        self.user_bias, self.item_bias = nn.Embedding(users, 1), nn.Embedding(items, 1)
        for table in (self.user, self.item):
            nn.init.normal_(table.weight, std=0.1)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        u, i = pairs[:, 0], pairs[:, 1]
        return (self.user(u) * self.item(i)).sum(1) + self.user_bias(u)[:, 0] + self.item_bias(i)[:, 0]


def _mf_ratings(gen, batch_size, lr, planned):
    pairs, ratings = _ratings()
    model = _Factorisation(int(pairs[:, 0].max()) + 1, int(pairs[:, 1].max()) + 1)
    return SupervisedJob((pairs, ratings), model, F.mse_loss, torch.optim.Adagrad(model.parameters(), lr=lr),
                         gen, batch_size)


def _ae_digits(gen, batch_size, lr, planned):
    x, _ = _sklearn_xy("digits")
    model = _mlp([64, 32, 8, 32, 64])
    return SupervisedJob((x, x), model, F.mse_loss, torch.optim.RMSprop(model.parameters(), lr=lr), gen, batch_size)


def _mlp_moons(gen, batch_size, lr, planned):
    model = _mlp([2, 64, 64, 2])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    return SupervisedJob(_moons(), model, F.cross_entropy, optimizer, gen, batch_size,
                         lr_schedule(optimizer, "step", planned))


class _ResidualMLP(nn.Module):
    def __init__(self, n_in: int, width: int = 64, blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(n_in, width)
        self.blocks = nn.ModuleList(_mlp([width, width, width]) for _ in range(blocks))
        self.out = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(F.relu(h))
        return self.out(F.relu(h)).squeeze(-1)


def _resmlp_friedman(gen, batch_size, lr, planned):
    model = _ResidualMLP(10)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True)
    return SupervisedJob(_friedman(), model, F.mse_loss, optimizer, gen, batch_size,
                         lr_schedule(optimizer, "warmup", planned))


class _Forecaster(nn.Module):
    """Dilated causal-style 1-D convolutions over a window, then a linear head for the next values."""

    def __init__(self, window: int = 32, ahead: int = 4, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, padding=2, dilation=2)
        self.head = nn.Linear(channels * window, ahead)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.conv2(F.relu(self.conv1(x)))).flatten(1))


def _tcn_forecast(gen, batch_size, lr, planned):
    model = _Forecaster()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    return SupervisedJob(_series(), model, F.mse_loss, optimizer, gen, batch_size,
                         lr_schedule(optimizer, "cosine", planned))


class _ShapesCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 3 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.head(F.max_pool2d(F.relu(self.conv2(x)), 2).flatten(1))


def _cnn_shapes(gen, batch_size, lr, planned):
    model = _ShapesCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-2)
    return SupervisedJob(_shapes(), model, F.cross_entropy, optimizer, gen, batch_size,
                         lr_schedule(optimizer, "step", planned, milestones=(0.4, 0.8), gamma=0.3))


class _CharTransformer(nn.Module):
    """A one-block causal transformer over characters (learned positions)."""

    def __init__(self, vocab: int, dim: int = 32, heads: int = 2, context: int = 24) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, context, dim) * 0.02)
        self.block = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        return self.head(self.block(self.embed(x) + self.pos[:, :n], src_mask=self.causal[:n, :n], is_causal=True))


def _tfm_charlm(gen, batch_size, lr, planned):
    corpus, vocab = _text_corpus()
    model = _CharTransformer(vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return LanguageModelJob(corpus, vocab, model, optimizer, gen, batch_size,
                            schedule=lr_schedule(optimizer, "warmup_cosine", planned))


WIDE_FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("gcn_blocks", WIDE, "gcn", "block_model_graph", (16, 32, 64), (3e-3, 3e-2), _gcn_blocks),
        Family("mf_ratings", WIDE, "matrix_factorisation", "low_rank_ratings", (32, 64, 128), (1e-2, 2e-1),
               _mf_ratings),
        Family("ae_digits", WIDE, "autoencoder", "digits", (16, 32, 64), (3e-4, 3e-3), _ae_digits),
        Family("mlp_moons", WIDE, "mlp", "moons", (16, 32, 64), (3e-3, 1e-1), _mlp_moons),
        Family("resmlp_friedman", WIDE, "residual_mlp", "friedman1", (16, 32, 64), (1e-3, 3e-2), _resmlp_friedman),
        Family("tcn_forecast", WIDE, "dilated_cnn1d", "seasonal_series", (16, 32, 64), (3e-4, 1e-2), _tcn_forecast),
        Family("cnn_shapes", WIDE, "cnn", "noisy_shapes", (16, 32, 64), (3e-4, 1e-2), _cnn_shapes),
        Family("tfm_charlm", WIDE, "transformer", "sklearn_descr_text", (16, 32), (1e-3, 1e-2), _tfm_charlm),
    ]
}
