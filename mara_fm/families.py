"""Model–dataset configurations whose real training runs fill the curve bank.

Every curve is the per-batch training loss of an actual optimisation run
(docs/design.md §2). Data is either bundled with scikit-learn, generated locally with
a fixed data seed, or produced by Gymnasium's built-in environments, so the
bank builds offline. Each run draws its own initialisation, data order,
batch size and learning rate from the run seed, which is what makes one
family's curves differ in speed and shape.

ID (8 families, 4 modalities): tabular (cancer, wine, diabetes), image
(digits MLP and CNN), sequence/text (character GRU language model, LSTM
adding problem) and audio-like signals (1-D CNN on synthetic waveforms).
RL OOD: DQN on CartPole and Acrobot, loss = the TD (Huber) loss.
ViT OOD: a small vision transformer on digits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from mara_common.threads import torch_threads
from mara_fm.jobs import DQNJob, LanguageModelJob, SupervisedJob, TrainingJob

DATA_SEED = 1234  # fixed seed of the locally generated datasets (not of the runs)


@dataclass(frozen=True)
class Family:
    """One model–dataset configuration and its randomisation ranges."""

    name: str
    task_set: str
    model: str
    dataset: str
    batch_sizes: tuple[int, ...]
    lr_range: tuple[float, float]  # log-uniform
    build: Callable[[torch.Generator, int, float, int], TrainingJob]  # (data generator, batch size, lr, planned batches)

    def hyperparameters(self, seed: int) -> tuple[int, float]:
        """The run's batch size and learning rate, drawn from its seed."""
        rng = np.random.default_rng(seed)
        batch_size = int(rng.choice(self.batch_sizes))
        lo, hi = np.log(self.lr_range[0]), np.log(self.lr_range[1])
        return batch_size, float(np.exp(rng.uniform(lo, hi)))

    def job(self, seed: int, planned: int, hyperparameters: tuple[int, float] | None = None) -> TrainingJob:
        """The run of `seed` as a job, before its first batch. The model's initial weights come
        from `torch.manual_seed(seed)` (the global generator is restored afterwards), the data
        order from a generator of its own; `planned` batches set the schedules that need a length.
        `hyperparameters` (batch size, lr) replace the ones `seed` draws: the same job, trained
        again with other weights and data order."""
        batch_size, lr = hyperparameters or self.hyperparameters(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.build(torch.Generator().manual_seed(seed), batch_size, lr, planned)

    def run(self, seed: int, cap: int, hyperparameters: tuple[int, float] | None = None) -> dict:
        """One real training run of `cap` batches without a pause; returns a bank row (minus ids).
        `hyperparameters` as in `job`. It runs on one torch thread: the thread count changes
        float sums in the last bits, and a run must give its curve whoever calls it."""
        batch_size, lr = hyperparameters or self.hyperparameters(seed)
        with torch_threads(1):
            job = self.job(seed, cap, (batch_size, lr))
            losses = np.array([job.step() for _ in range(cap)])
        if not np.all(np.isfinite(losses)):
            raise RuntimeError(f"family {self.name}: seed {seed} produced a non-finite loss")
        return {
            "family": self.name,
            "task_set": self.task_set,
            "model": self.model,
            "dataset": self.dataset,
            "seed": seed,
            "batch_size": batch_size,
            "lr": lr,
            # A loss of exactly 0 is impossible for these objectives in exact
            # arithmetic; float32 underflow is floored so the bank stays > 0.
            "losses": np.maximum(losses, 1e-12).astype(np.float64),
        }


# ---------------------------------------------------------------- datasets


@functools.cache
def _sklearn_xy(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn import datasets

    loader = {
        "digits": datasets.load_digits,
        "breast_cancer": datasets.load_breast_cancer,
        "wine": datasets.load_wine,
        "diabetes": datasets.load_diabetes,
    }[name]
    x, y = loader(return_X_y=True)
    x = (x - x.mean(0)) / (x.std(0) + 1e-8)
    if name == "diabetes":
        y = (y - y.mean()) / y.std()
        return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


@functools.cache
def _text_corpus() -> tuple[torch.Tensor, int]:
    """Characters of the dataset descriptions that ship with scikit-learn."""
    from sklearn import datasets

    loaders = [
        datasets.load_iris,
        datasets.load_digits,
        datasets.load_wine,
        datasets.load_breast_cancer,
        datasets.load_diabetes,
        datasets.load_linnerud,
    ]
    text = "\n".join(loader().DESCR for loader in loaders).lower()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(vocab)


@functools.cache
def _adding_problem(n: int = 4096, length: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    """The classic adding problem: sum the two marked values of a sequence."""
    rng = np.random.default_rng(DATA_SEED)
    values = rng.uniform(0, 1, (n, length))
    marks = np.zeros((n, length))
    for i in range(n):
        a, b = rng.choice(length, 2, replace=False)
        marks[i, [a, b]] = 1.0
    x = np.stack([values, marks], axis=-1)
    y = (values * marks).sum(1)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)


@functools.cache
def _waveforms(n: int = 3000, length: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Audio-like signals: noisy sine, square, sawtooth and chirp waves."""
    rng = np.random.default_rng(DATA_SEED)
    t = np.linspace(0, 1, length)
    y = rng.integers(0, 4, n)
    freq = rng.uniform(2, 12, n)[:, None]
    phase = rng.uniform(0, 2 * np.pi, n)[:, None]
    arg = 2 * np.pi * freq * t + phase
    waves = np.where(
        (y == 0)[:, None],
        np.sin(arg),
        np.where(
            (y == 1)[:, None],
            np.sign(np.sin(arg)),
            np.where((y == 2)[:, None], 2 * ((arg / (2 * np.pi)) % 1) - 1, np.sin(arg * (0.5 + t))),
        ),
    )
    x = waves * rng.uniform(0.5, 1.5, (n, 1)) + rng.normal(0, 0.6, (n, length))
    return torch.tensor(x[:, None, :], dtype=torch.float32), torch.tensor(y, dtype=torch.long)


# ---------------------------------------------------------------- models and jobs


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _mlp_digits(gen, batch_size, lr, planned):
    model = _mlp([64, 64, 10])
    return SupervisedJob(_sklearn_xy("digits"), model, F.cross_entropy,
                         torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9), gen, batch_size)


class _DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 1, 8, 8)
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.head(x.flatten(1))


def _cnn_digits(gen, batch_size, lr, planned):
    model = _DigitsCNN()
    return SupervisedJob(_sklearn_xy("digits"), model, F.cross_entropy,
                         torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


def _logreg_cancer(gen, batch_size, lr, planned):
    model = nn.Linear(30, 2)
    return SupervisedJob(_sklearn_xy("breast_cancer"), model, F.cross_entropy,
                         torch.optim.SGD(model.parameters(), lr=lr), gen, batch_size)


def _mlp_wine(gen, batch_size, lr, planned):
    model = _mlp([13, 32, 3])
    return SupervisedJob(_sklearn_xy("wine"), model, F.cross_entropy,
                         torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


def _squeezed_mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.squeeze(-1), y)


def _mlp_diabetes(gen, batch_size, lr, planned):
    model = _mlp([10, 32, 32, 1])
    return SupervisedJob(_sklearn_xy("diabetes"), model, _squeezed_mse,
                         torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


class _CharGRU(nn.Module):
    def __init__(self, vocab: int, hidden: int = 48) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 16)
        self.gru = nn.GRU(16, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.gru(self.embed(x))[0])


def _gru_charlm(gen, batch_size, lr, planned):
    corpus, vocab = _text_corpus()
    model = _CharGRU(vocab)
    return LanguageModelJob(corpus, vocab, model, torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


class _AddingLSTM(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1]).squeeze(-1)


def _lstm_adding(gen, batch_size, lr, planned):
    model = _AddingLSTM()
    return SupervisedJob(_adding_problem(), model, F.mse_loss,
                         torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


class _SignalCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(1, 8, 7, stride=2, padding=3)
        self.conv2 = nn.Conv1d(8, 16, 5, stride=2, padding=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        return self.head(x.mean(-1))


def _cnn1d_signals(gen, batch_size, lr, planned):
    model = _SignalCNN()
    return SupervisedJob(_waveforms(), model, F.cross_entropy,
                         torch.optim.Adam(model.parameters(), lr=lr), gen, batch_size)


class _TinyViT(nn.Module):
    """Patch embedding (2x2 patches of an 8x8 image), one Transformer block, CLS head."""

    def __init__(self, dim: int = 32, heads: int = 2, patch: int = 2) -> None:
        super().__init__()
        self.patch = patch
        n_patches = (8 // patch) ** 2
        self.embed = nn.Linear(patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, dim) * 0.02)
        self.block = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch
        img = x.view(-1, 8 // p, p, 8 // p, p).permute(0, 1, 3, 2, 4).reshape(len(x), -1, p * p)
        tokens = torch.cat([self.cls.expand(len(x), -1, -1), self.embed(img)], 1) + self.pos
        return self.head(self.block(tokens)[:, 0])


def _vit_digits(gen, batch_size, lr, planned):
    model = _TinyViT()
    return SupervisedJob(_sklearn_xy("digits"), model, F.cross_entropy,
                         torch.optim.AdamW(model.parameters(), lr=lr), gen, batch_size)


def _q_network(n_obs: int, n_act: int) -> nn.Module:
    return _mlp([n_obs, 64, 64, n_act])


def _dqn(env_id: str, gen, batch_size, lr, planned):
    return DQNJob(env_id, _q_network, gen, batch_size, lr, planned)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("mlp_digits", "id", "mlp", "digits", (16, 32, 64), (0.003, 0.05), _mlp_digits),
        Family("cnn_digits", "id", "cnn", "digits", (16, 32, 64), (3e-4, 5e-3), _cnn_digits),
        Family("logreg_cancer", "id", "logreg", "breast_cancer", (8, 16, 32), (1e-3, 3e-2), _logreg_cancer),
        Family("mlp_wine", "id", "mlp", "wine", (8, 16, 32), (3e-4, 1e-2), _mlp_wine),
        Family("mlp_diabetes", "id", "mlp", "diabetes", (16, 32, 64), (3e-4, 1e-2), _mlp_diabetes),
        Family("gru_charlm", "id", "gru", "sklearn_descr_text", (16, 32), (2e-3, 2e-2), _gru_charlm),
        Family("lstm_adding", "id", "lstm", "adding_problem", (16, 32, 64), (1e-3, 2e-2), _lstm_adding),
        Family("cnn1d_signals", "id", "cnn1d", "waveforms", (16, 32, 64), (3e-4, 1e-2), _cnn1d_signals),
        Family("dqn_cartpole", "rl_ood", "dqn", "CartPole-v1", (32, 64), (1e-4, 3e-3), functools.partial(_dqn, "CartPole-v1")),
        Family("dqn_acrobot", "rl_ood", "dqn", "Acrobot-v1", (32, 64), (1e-4, 3e-3), functools.partial(_dqn, "Acrobot-v1")),
        Family("vit_digits", "vit_ood", "vit", "digits", (16, 32, 64), (3e-4, 5e-3), _vit_digits),
    ]
}
