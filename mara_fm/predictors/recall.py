"""Recall: FM's own training runs kept as a memory, read by the job kind the prefix reveals
(docs/design.md §5.6).

FM compresses its training curves into a small network that does not tell one
job kind from another (docs/experiments.md, "What a forecast could know").
The prefix, batch size and learning rate do tell them apart: the memory run
nearest to an ID validation prefix, compared at the same length, is of the
prefix's own kind 92% of the time. This predictor uses that: it names the
task's kind, finds the memory runs of that kind nearest the prefix in shape
(as the history predictor does, `HistoryPredictor.nearest`) and answers from
their crossings of ε. Where those runs had to be moved far to meet the task's
level, or still lie far from its prefix, the task is taken for a kind the
memory does not hold and FM answers instead. It reads nothing FM does not:
the observed prefix, batch size and learning rate, and the curves FM was
trained on; the paper's setting.

The memory is `memory.npz` in the exported FM folder, the real training curves
(ID, and the wide families' where FM trains on them) that `train-predictor`
writes beside the weights.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mara_fm.bank import CurveSet
from mara_fm.predictors.base import HistoryBatch, take
from mara_fm.predictors.fm import ArtifactError, FMPredictor, SampledPredictor
from mara_fm.predictors.history import HistoryPredictor
from mara_fm.predictors.oracle import first_crossing

MEMORY_FILE = "memory.npz"
_FIELDS = tuple(f.name for f in dataclasses.fields(CurveSet))
_SPOTS = np.array([0.1, 0.25, 0.5, 0.75, 0.9])  # where along a prefix the features read its level


@dataclass(frozen=True)
class RecallConfig:
    """Chosen by family-held-out validation (experiments/probes/recall_probe.py;
    docs/decisions.md, "Recall")."""

    # A task is answered from memory when its nearest runs had to be moved by at most
    # `max_shift` in log loss (their median) to meet its level, and then lie within
    # `max_distance` (their mean squared log distance over the prefix); FM answers otherwise.
    max_shift: float = 0.1
    max_distance: float = 0.0015
    # And, when finite, only if the kind reader's nearest memory run lies within `max_novelty`
    # of the prefix (mean squared standardised feature distance, `KindReader.read`): a gate on
    # whether the memory holds anything like the task at all. Off (inf): measured on families
    # held out of FM and memory alike, not adopted (docs/experiments.md, "Recall's gates on
    # families neither FM nor the memory saw").
    max_novelty: float = np.inf

    def __post_init__(self) -> None:
        if min(self.max_shift, self.max_distance, self.max_novelty) < 0:
            raise ValueError(f"recall: max_shift, max_distance and max_novelty must be ≥ 0, got {self.max_shift}, "
                             f"{self.max_distance}, {self.max_novelty}")

    def admits(self, match: Match) -> np.ndarray:
        """(B,) where the memory answers: the tasks whose nearest runs pass every gate (never
        those of a kind with fewer than M runs, whose shift is NaN)."""
        return ((match.shift <= self.max_shift) & (match.distance <= self.max_distance)
                & (match.novelty <= self.max_novelty))


def save_memory(curves: CurveSet, fm_dir: str | Path) -> Path:
    """Write the curves FM trained on into its exported folder."""
    path = Path(fm_dir) / MEMORY_FILE
    np.savez_compressed(path, **{f: getattr(curves, f) for f in _FIELDS})
    return path


def has_memory(fm_dir: str | Path) -> bool:
    """Whether an exported FM folder holds a memory (one exported before recall existed does not)."""
    return (Path(fm_dir) / MEMORY_FILE).is_file()


def load_memory(fm_dir: str | Path) -> CurveSet:
    path = Path(fm_dir) / MEMORY_FILE
    if not has_memory(fm_dir):
        raise ArtifactError(f"{path}: recall memory not found (`mara train-predictor` writes it "
                            "beside FM's weights)")
    try:
        with np.load(path, allow_pickle=False) as data:
            curves = CurveSet(*(data[f] for f in _FIELDS))
    except Exception as exc:
        raise ArtifactError(f"{path}: not a readable recall memory ({exc})") from exc
    if not np.isfinite(curves.losses).all() or (curves.losses <= 0).any():
        raise ArtifactError(f"{path}: recall memory holds non-finite or non-positive losses")
    return curves


def prefix_features(hist: HistoryBatch) -> np.ndarray:
    """(B, 17) what the kind reader compares: log batch size, log learning rate, log length,
    the log loss first, now, their difference and the recent slope, and the log loss at five
    spots along the prefix, as it is and relative to now."""
    logs = np.log(np.where(np.isnan(hist.avg), 1.0, hist.avg))
    n = hist.lengths
    rows = np.arange(len(n))
    first, now = logs[:, 0], logs[rows, n - 1]
    back = np.minimum(5, n)
    slope = (now - logs[rows, n - back]) / back
    spots = logs[rows[:, None], (_SPOTS[None, :] * (n[:, None] - 1)).astype(np.int64)]
    return np.column_stack([np.log(hist.batch_size), np.log(hist.lr), np.log(n), first, now, now - first,
                            slope, spots, spots - now[:, None]])


class KindReader:
    """Names the kind of a prefix of n points: the kind of the memory run whose own first n
    points lie nearest to it in `prefix_features`, each feature standardised over the memory's
    runs at that length. Nothing is fitted; a length's table is built the first time it is asked."""

    def __init__(self, memory: CurveSet) -> None:
        self.memory = memory
        self.tables: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def table(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The memory's standardised features at length n, with their mean and scale."""
        if n not in self.tables:
            memory = self.memory
            cut = HistoryBatch.from_curves(memory.avg, np.full(len(memory), n), memory.batch_size, memory.lr)
            features = prefix_features(cut)
            mean, scale = features.mean(axis=0), features.std(axis=0)
            scale[scale == 0] = 1.0  # the log length, the same for every run of the table
            self.tables[n] = ((features - mean) / scale, mean, scale)
        return self.tables[n]

    def read(self, hist: HistoryBatch) -> tuple[np.ndarray, np.ndarray]:
        """(B,) each prefix's kind and (B,) its novelty: the mean squared standardised feature
        distance to that nearest run (small where the memory holds runs like it)."""
        features = prefix_features(hist)
        kinds = np.empty(len(hist), dtype=self.memory.families.dtype)
        novelty = np.empty(len(hist))
        for b, n in enumerate(hist.lengths):
            table, mean, scale = self.table(int(n))
            apart = np.sum((table - (features[b] - mean) / scale) ** 2, axis=1)
            nearest = np.argmin(apart)
            kinds[b], novelty[b] = self.memory.families[nearest], apart[nearest] / table.shape[1]
        return kinds, novelty

    def __call__(self, hist: HistoryBatch) -> np.ndarray:
        return self.read(hist)[0]


@dataclass(frozen=True)
class Match:
    """What the memory holds for each of B tasks."""

    kinds: np.ndarray  # (B,) the recognised kind
    novelty: np.ndarray  # (B,) how far the nearest memory run of any kind lies (`KindReader.read`)
    # (B,) median |log shift| that moved the M nearest runs to the task's level; NaN for a kind
    # with fewer than M runs
    shift: np.ndarray
    distance: np.ndarray  # (B,) their mean squared log distance from the prefix, once moved
    near: np.ndarray  # (B, M) those runs, rows of the kind's runs in the memory
    moved: np.ndarray  # (B, M) the log shift that moved each


class RecallPredictor(SampledPredictor):
    """M crossings per task from the M memory runs of its recognised kind nearest its prefix;
    FM's M sampled crossings for a task the memory does not recognise."""

    name = "recall"

    def __init__(self, memory: CurveSet, fallback: SampledPredictor, cfg: RecallConfig = RecallConfig(),
                 reader: KindReader | None = None) -> None:
        self.cfg, self.fallback = cfg, fallback
        self.runs = HistoryPredictor(memory, neighbours=fallback.samples)
        # A kind with fewer than M runs cannot give M samples: its tasks are left to FM.
        self.recallable = {kind for kind, runs in self.runs.runs.items() if len(runs) >= fallback.samples}
        self.reader = reader or KindReader(memory)

    @property
    def samples(self) -> int:
        return self.fallback.samples

    def resampled(self, sampler_seed: int) -> RecallPredictor:
        return RecallPredictor(self.runs.pool, self.fallback.resampled(sampler_seed), self.cfg, self.reader)

    def match(self, hist: HistoryBatch) -> Match:
        """Each task's recognised kind and its M nearest memory runs of that kind."""
        kinds, novelty = self.reader.read(hist)
        logs = hist.log_prefix()
        m, b_all = self.samples, len(hist)
        shift, distance = np.full(b_all, np.nan), np.full(b_all, np.nan)  # NaN passes no gate
        near, moved = np.zeros((b_all, m), np.int64), np.zeros((b_all, m))
        for b, (kind, n) in enumerate(zip(kinds, hist.lengths, strict=True)):
            if kind in self.recallable:
                near[b], moved[b], apart = self.runs.nearest(str(kind), logs[b, :n], m)
                shift[b], distance[b] = np.median(np.abs(moved[b])), apart.mean()
        return Match(kinds, novelty, shift, distance, near, moved)

    def answered(self, match: Match) -> np.ndarray:
        """Where the memory answers (`RecallConfig.admits`)."""
        return self.cfg.admits(match)

    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        match = self.match(hist)
        return self.crossings(match, self.answered(match), hist, eps, horizon)

    def crossings(self, match: Match, answered: np.ndarray, hist: HistoryBatch, eps: np.ndarray,
                  horizon: np.ndarray) -> np.ndarray:
        """(B, M) ascending: the matched runs' crossings where `answered`, FM's elsewhere."""
        out = np.empty((len(hist), self.samples))
        m = self.samples
        for b in np.flatnonzero(answered):
            curves = np.exp(self.runs.runs[str(match.kinds[b])][match.near[b]] + match.moved[b][:, None])
            n = np.full(m, hist.lengths[b])
            out[b] = np.sort(first_crossing(curves, n, np.full(m, eps[b]), np.full(m, horizon[b])))
        if not answered.all():
            rest = ~answered
            out[rest] = self.fallback.sorted_crossings(take(hist, rest), eps[rest], horizon[rest])
        return out

    @classmethod
    def load(cls, fm_dir: str | Path) -> RecallPredictor:
        """FM and its memory from an exported FM folder (once per process and folder version)."""
        fm_dir = Path(fm_dir)
        stamps = tuple((fm_dir / f).stat().st_mtime if (fm_dir / f).exists() else 0.0
                       for f in (MEMORY_FILE, "config.json", "weights.pt"))
        return _loaded(str(fm_dir), stamps)


@functools.lru_cache(maxsize=4)
def _loaded(fm_dir: str, stamps: tuple[float, ...]) -> RecallPredictor:
    return RecallPredictor(load_memory(fm_dir), FMPredictor.load(fm_dir))

