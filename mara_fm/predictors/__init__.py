"""Predictors of remaining demand, behind one interface (`Predictor`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from mara_fm.bank import bank_digest
from mara_fm.predictors.base import WARMUP_POINTS, HistoryBatch, Predictor
from mara_fm.predictors.fm import CONFIG_FILE, WEIGHTS_FILE, FMPredictor, SampledPredictor
from mara_fm.predictors.history import HistoryPredictor
from mara_fm.predictors.oracle import OraclePredictor, first_crossing
from mara_fm.predictors.recall import MEMORY_FILE, RecallPredictor, save_memory
from mara_fm.predictors.wls import WLSPredictor

__all__ = [
    "WARMUP_POINTS", "FMPredictor", "HistoryBatch", "HistoryPredictor", "Predictor", "OraclePredictor",
    "RecallPredictor", "SampledPredictor", "WLSPredictor", "first_crossing", "make_predictor",
    "predictor_digest", "save_memory", "FM_FOLDER",
]

# The predictors whose spec names an exported FM folder (`<name>:<path>`).
FM_FOLDER = ("fm", "recall")


def make_predictor(spec: str | Predictor) -> Predictor:
    """`wls`, `oracle`, `fm:<path to an exported FM predictor>`, `recall:<the same path>` (FM
    with its training runs as a memory) or `history:<path to a history bank>`."""
    if isinstance(spec, Predictor):
        return spec
    if spec == "wls":
        return WLSPredictor()
    if spec == "oracle":
        return OraclePredictor()
    if spec.startswith("fm:"):
        return FMPredictor.load(spec[3:])
    if spec.startswith("recall:"):
        return RecallPredictor.load(spec[7:])
    if spec.startswith("history:"):
        return HistoryPredictor.load(spec[8:])
    raise ValueError(f"unknown predictor {spec!r}: use 'wls', 'oracle', 'fm:<path>', 'recall:<path>' "
                     "or 'history:<path>'")


def predictor_digest(spec: str) -> str:
    """A content hash of the predictor `spec` names: its files for `fm:<path>` (and the memory
    for `recall:<path>`), the name for the built-in ones, the pool's bank for `history:<path>`.
    Whatever was trained with a predictor can check that the files at that path are still the
    ones it saw (retraining writes the same path)."""
    if spec.startswith("history:"):
        return bank_digest(spec[8:])
    kind, _, folder = spec.partition(":")
    if kind not in FM_FOLDER:
        return spec
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE) + ((MEMORY_FILE,) if kind == "recall" else ()):
        path = Path(folder) / name
        if not path.exists():
            raise FileNotFoundError(f"{path}: exported FM predictor file missing (train one with "
                                    "`mara train-predictor`)")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
