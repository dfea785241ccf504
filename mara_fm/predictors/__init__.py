"""Predictors of remaining demand, behind one interface (`Predictor`)."""

from __future__ import annotations

from mara_fm.predictors.base import WARMUP_POINTS, HistoryBatch, Predictor
from mara_fm.predictors.oracle import OraclePredictor, first_crossing
from mara_fm.predictors.wls import WLSPredictor

__all__ = [
    "WARMUP_POINTS", "HistoryBatch", "Predictor", "OraclePredictor", "WLSPredictor",
    "first_crossing", "make_predictor",
]


def make_predictor(spec: str | Predictor) -> Predictor:
    """`wls`, `oracle`, or `fm:<path to an exported FM predictor>`."""
    if isinstance(spec, Predictor):
        return spec
    if spec == "wls":
        return WLSPredictor()
    if spec == "oracle":
        return OraclePredictor()
    if spec.startswith("fm:"):
        from mara_fm.fm_predictor import FMPredictor

        return FMPredictor.load(spec[3:])
    raise ValueError(f"unknown predictor {spec!r}: use 'wls', 'oracle' or 'fm:<path>'")
