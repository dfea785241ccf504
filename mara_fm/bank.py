"""The curve bank: one Parquet row per real training run (docs/design.md §2).

Any Parquet file with these columns is a bank; `load_bank` validates it and
names the file, the column and the curve of the first problem it finds, so a
bank built elsewhere either works everywhere or fails loudly at load time.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

COLUMNS: dict[str, pa.DataType] = {
    "curve_id": pa.string(),
    "family": pa.string(),
    "task_set": pa.string(),
    "split": pa.string(),
    "model": pa.string(),
    "dataset": pa.string(),
    "seed": pa.int64(),
    "batch_size": pa.int64(),
    "lr": pa.float64(),
    "losses": pa.list_(pa.float64()),
}
SPLITS = ("train", "val", "test")
SCHEMA = pa.schema([pa.field(name, dtype) for name, dtype in COLUMNS.items()])


class BankError(ValueError):
    """A bank file that does not follow the schema of docs/design.md §2."""


@dataclass(frozen=True)
class CurveSet:
    """Curves of one (task set, split) as dense arrays, ready for simulation.

    `losses[i]` is the per-batch loss of curve i and `avg[i]` its cumulative
    average L after 1..cap batches (the quantity the simulator reveals).
    """

    ids: np.ndarray  # (n,) str
    families: np.ndarray  # (n,) str
    batch_size: np.ndarray  # (n,) int64
    lr: np.ndarray  # (n,) float64
    losses: np.ndarray  # (n, cap) float64

    @functools.cached_property
    def avg(self) -> np.ndarray:
        return np.cumsum(self.losses, axis=1) / np.arange(1, self.cap + 1)

    @functools.cached_property
    def log_avg(self) -> np.ndarray:
        """log of `avg`, taken once per curve set and shared by every env replaying it."""
        return np.log(self.avg)

    @property
    def revision(self) -> int:
        """Changes whenever a curve's known points change: never for a bank's curves
        (derived arrays may be cached per curve set and revision)."""
        return 0

    @property
    def cap(self) -> int:
        return int(self.losses.shape[1])

    def __len__(self) -> int:
        return len(self.ids)

    def family_names(self) -> list[str]:
        return sorted(set(self.families.tolist()))


def save_bank(frame: pd.DataFrame, path: str | Path) -> Path:
    """Validate `frame` and write it as a bank file."""
    path = Path(path)
    validate_frame(frame, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame[list(COLUMNS)], schema=SCHEMA, preserve_index=False)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def load_bank(path: str | Path) -> pd.DataFrame:
    """Read and validate a bank file; raise `BankError` naming what is wrong."""
    path = Path(path)
    if not path.exists():
        raise BankError(f"{path}: bank file not found (build one with `mara curves`)")
    try:
        frame = pq.read_table(path).to_pandas()
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise BankError(f"{path}: not a readable Parquet file ({exc})") from exc
    validate_frame(frame, str(path))
    return frame


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool | np.bool_)


def _is_losses(value: object) -> bool:
    """A flat sequence of numbers (its values are checked later: finite, > 0, one length)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and value.dtype.kind in "iuf"
    return isinstance(value, list | tuple) and all(_is_real(x) for x in value)


# What each column's cells must be (every label is a non-empty string: any task_set is allowed).
CELL_CHECKS = {
    **{name: (lambda v: isinstance(v, str) and v != "", "a non-empty string")
       for name, dtype in COLUMNS.items() if dtype == pa.string()},
    "seed": (_is_int, "an integer"),
    "batch_size": (_is_int, "an integer"),
    "lr": (_is_real, "a number"),
    "losses": (_is_losses, "a list of numbers"),
}


def _where(frame: pd.DataFrame, row: int) -> str:
    """`curve '<id>'` of a row, or `row <i>` where its id itself is missing or not a string."""
    cid = frame["curve_id"].iloc[row]
    return f"curve {cid!r}" if isinstance(cid, str) and cid else f"row {row}"


def _check_cells(frame: pd.DataFrame, source: str) -> None:
    """Every cell present (lr's NaN is left to the range check) and of its column's type."""
    for col, (ok, expected) in CELL_CHECKS.items():
        values = frame[col]
        null = values.isna().to_numpy() if col != "lr" else np.zeros(len(frame), bool)
        if null.any():
            row = int(np.flatnonzero(null)[0])
            raise BankError(f"{source}: column {col!r} of {_where(frame, row)} is missing (null)")
        cells = values.tolist() if col != "losses" else list(values)
        for row, value in enumerate(cells):
            if not ok(value):
                shown = repr(value)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise BankError(f"{source}: column {col!r} of {_where(frame, row)} is {shown} "
                                f"({type(value).__name__}), expected {expected}")


def validate_frame(frame: pd.DataFrame, source: str) -> None:
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise BankError(f"{source}: missing column(s) {missing}")
    if len(frame) == 0:
        raise BankError(f"{source}: the bank holds no curves")
    _check_cells(frame, source)
    dup = frame["curve_id"][frame["curve_id"].duplicated()]
    if len(dup):
        raise BankError(f"{source}: column 'curve_id' has duplicate id {dup.iloc[0]!r}")
    bad_split = frame.loc[~frame["split"].isin(SPLITS)]
    if len(bad_split):
        row = bad_split.iloc[0]
        raise BankError(
            f"{source}: column 'split' of curve {row.curve_id!r} is {row.split!r}, "
            f"expected one of {SPLITS}"
        )
    for col in ("batch_size",):
        bad = frame.loc[~(frame[col] > 0)]
        if len(bad):
            raise BankError(f"{source}: column {col!r} of curve {bad.iloc[0].curve_id!r} is not > 0")
    bad = frame.loc[~(np.isfinite(frame["lr"].astype(float)) & (frame["lr"] > 0))]
    if len(bad):
        raise BankError(f"{source}: column 'lr' of curve {bad.iloc[0].curve_id!r} is not finite > 0")
    lengths = frame["losses"].map(lambda x: 0 if x is None else len(x))
    cap = int(lengths.iloc[0])
    for cid, losses, n in zip(frame["curve_id"], frame["losses"], lengths, strict=True):
        if n != cap or n < 2:
            raise BankError(
                f"{source}: column 'losses' of curve {cid!r} has length {n}, "
                f"expected {cap} like the first curve (and at least 2)"
            )
        arr = np.asarray(losses, dtype=float)
        if not np.all(np.isfinite(arr)):
            raise BankError(f"{source}: column 'losses' of curve {cid!r} holds NaN or inf")
        if not np.all(arr > 0):
            raise BankError(f"{source}: column 'losses' of curve {cid!r} holds a loss <= 0")


def select(frame: pd.DataFrame, task_set: str, split: str) -> CurveSet:
    """The curves of one task set and split, as a `CurveSet`."""
    sub = frame[(frame["task_set"] == task_set) & (frame["split"] == split)]
    if len(sub) == 0:
        have = sorted(set(zip(frame["task_set"], frame["split"], strict=True)))
        raise BankError(f"no curves for task_set={task_set!r} split={split!r}; the bank has {have}")
    return curve_set(sub)


def curve_set(frame: pd.DataFrame) -> CurveSet:
    """Every row of a (validated) bank frame as a `CurveSet`, ordered by curve id."""
    sub = frame.sort_values("curve_id")
    return CurveSet(
        ids=sub["curve_id"].to_numpy(dtype=str),
        families=sub["family"].to_numpy(dtype=str),
        batch_size=sub["batch_size"].to_numpy(dtype=np.int64),
        lr=sub["lr"].to_numpy(dtype=np.float64),
        losses=np.stack([np.asarray(x, dtype=np.float64) for x in sub["losses"]]),
    )


@functools.lru_cache(maxsize=32)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:16]


def bank_digest(path: str | Path) -> str:
    """A hash of the bank file's content: what anything derived from a bank is keyed by
    (a rebuilt or different bank at the same path gets a new key)."""
    path = Path(path)
    if not path.exists():
        raise BankError(f"{path}: bank file not found (build one with `mara curves`)")
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
