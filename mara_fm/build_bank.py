"""Build the curve bank: many real training runs, in parallel, resumable.

Runs are grouped into chunks of one family; each finished chunk is written to
`<bank>.parts/` at once, so an interrupted build resumes without redoing any
finished chunk. The final bank is the concatenation of all chunks.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from mara_common.config import ConfigError, check_config, setting
from mara_common.profile import Profile
from mara_fm.bank import load_bank, save_bank
from mara_fm.families import FAMILIES, Family
from mara_fm.predictors import WARMUP_POINTS
from mara_fm.wide_families import WIDE_FAMILIES

# The task sets whose families train a predictor: split by curve like the ID set.
TRAINING_TASK_SETS = ("id", "wide")
SLOWEST = ("gru_charlm", "vit_digits", "lstm_adding", "tfm_charlm", "gcn_blocks")  # built first
EVERY_FAMILY = {**FAMILIES, **WIDE_FAMILIES}  # of both banks, by name

CHUNK = 10
MANIFEST = "config.json"  # in <bank>.parts/: the config the chunks were built with
SPLIT_FRACTIONS = {"train": 0.70, "val": 0.15, "test": 0.15}


@dataclass(frozen=True)
class BankConfig:
    """Profile section `[bank]`."""

    curves_per_id_family: int = setting(150, ge=1, help="training runs per ID family ([wide_bank]: per wide family), split 70/15/15")
    curves_per_ood_set: int = setting(100, ge=1, help="runs per OOD set, spread over its families")
    cap: int = setting(300, ge=2 * WARMUP_POINTS, help="batches recorded per run")
    seed: int = setting(0, help="root seed of every run's seed")
    workers: int = setting(0, ge=0, help="processes (0 = one per core)")

    def __post_init__(self) -> None:
        check_config(self)


def _recorded(cfg: BankConfig) -> dict:
    """What decides a bank's curves (the worker count does not)."""
    return {k: v for k, v in asdict(cfg).items() if k != "workers"}


def check_built_with(cfg: BankConfig, path: Path) -> None:
    """Refuse a bank (or the chunks of an unfinished one) that `<bank>.parts/config.json` records
    as built with another config than `cfg`: edited profile settings must not be served the old
    curves. A bank without that record (copied alone) is taken as it is."""
    manifest = path.with_suffix(".parts") / MANIFEST
    if manifest.exists() and json.loads(manifest.read_text()) != _recorded(cfg):
        raise ConfigError(
            f"{path} was built with another config ({manifest.read_text().strip()}) than the one asked "
            f"for ({json.dumps(_recorded(cfg))}); rebuild it with `mara curves --fresh` (`--wide` or `--history` for "
            "those banks), or give another --out"
        )


def curve_seed(root: int, family: str, index: int) -> int:
    """A run seed that depends only on (root seed, family, index)."""
    key = [root, index] + [ord(c) for c in family]
    return int(np.random.SeedSequence(key).generate_state(1)[0] & 0x7FFFFFFF)


def plan(cfg: BankConfig, families: dict[str, Family] = FAMILIES) -> list[tuple[str, int, str]]:
    """Every curve to build, as (family, index, split); ID and wide families split by curve."""
    jobs = []
    ood_sets: dict[str, list[str]] = {}
    for fam in families.values():
        if fam.task_set in TRAINING_TASK_SETS:
            n = cfg.curves_per_id_family
            order = np.random.default_rng(curve_seed(cfg.seed, fam.name, 10**6)).permutation(n)
            n_train = round(SPLIT_FRACTIONS["train"] * n)
            n_val = round(SPLIT_FRACTIONS["val"] * n)
            for rank, i in enumerate(order):
                split = "train" if rank < n_train else "val" if rank < n_train + n_val else "test"
                jobs.append((fam.name, int(i), split))
        else:
            ood_sets.setdefault(fam.task_set, []).append(fam.name)
    for names in ood_sets.values():
        for k, name in enumerate(sorted(names)):
            n = cfg.curves_per_ood_set // len(names) + (k < cfg.curves_per_ood_set % len(names))
            jobs += [(name, i, "test") for i in range(n)]  # OOD sets never train either stage
    return sorted(jobs)


def _run_chunk(args: tuple[list[tuple[str, int, str]], BankConfig, str]) -> tuple[str, int]:
    chunk, cfg, out = args
    rows = []
    for family, index, split in chunk:
        row = EVERY_FAMILY[family].run(curve_seed(cfg.seed, family, index), cfg.cap)
        row.update(curve_id=f"{family}-{index:05d}", split=split)
        rows.append(row)
    save_bank(pd.DataFrame(rows), out)
    return out, len(chunk)


def build_bank(cfg: BankConfig, path: str | Path, progress: bool = True, fresh: bool = False,
               families: dict[str, Family] = FAMILIES) -> Path:
    """Build (or finish building) the bank of `families` at `path`; returns the path. `fresh`
    discards the finished chunks of an earlier build first."""
    path = Path(path)
    parts = path.with_suffix(".parts")
    if fresh:
        shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True, exist_ok=True)
    check_built_with(cfg, path)
    (parts / MANIFEST).write_text(json.dumps(_recorded(cfg)))

    jobs = plan(cfg, families)
    chunks: list[tuple[list, BankConfig, str]] = []
    by_family: dict[str, list] = {}
    for job in jobs:
        by_family.setdefault(job[0], []).append(job)
    for family, fjobs in by_family.items():
        for c in range(0, len(fjobs), CHUNK):
            out = parts / f"{family}-{c // CHUNK:04d}.parquet"
            if not out.exists():
                chunks.append((fjobs[c : c + CHUNK], cfg, str(out)))
    # Slowest families first keeps both workers busy until the end.
    chunks.sort(key=lambda ch: ch[0][0][0] not in SLOWEST)
    todo = sum(len(c[0]) for c in chunks)
    workers = cfg.workers or os.cpu_count() or 1
    start = time.perf_counter()
    with tqdm(total=len(jobs), initial=len(jobs) - todo, desc="curves", unit="curve",
              disable=not progress, mininterval=2.0) as bar:
        if workers == 1 or len(chunks) <= 1:
            for ch in chunks:
                bar.update(_run_chunk(ch)[1])
        else:
            with mp.get_context("spawn").Pool(workers) as pool:
                for _, n in pool.imap_unordered(_run_chunk, chunks):
                    bar.update(n)
    elapsed = time.perf_counter() - start
    frame = pd.concat([load_bank(p) for p in sorted(parts.glob("*.parquet"))], ignore_index=True)
    frame = frame.sort_values("curve_id", ignore_index=True)
    save_bank(frame, path)
    (parts / "timing.json").write_text(json.dumps({"curves_built": todo, "seconds": elapsed}))
    return path


def ensure_bank(cfg: BankConfig, path: str | Path, progress: bool = True,
                families: dict[str, Family] = FAMILIES) -> Path:
    """The bank at `path`, built first if missing; one built with another config is refused."""
    path = Path(path)
    if not path.exists():
        return build_bank(cfg, path, progress, families=families)
    check_built_with(cfg, path)
    return path


BANKS = ("main", "wide", "history")


def bank_spec(profile: Profile, which: str = "main", **overrides: object) -> tuple[BankConfig, Path, dict[str, Family]]:
    """(config, default path, families) of one of the profile's banks; `overrides` replace
    section keys. `main`: `[bank]`, the evaluation's curves; `wide`: `[wide_bank]`, the extra
    families FM may train on (mara_fm/wide_families.py); `history`: `[history_bank]`, fresh runs
    of the main bank's families that the history predictor reads as finished runs."""
    paths = profile.paths
    if which == "wide":
        return profile.section(BankConfig, "wide_bank", **overrides), paths.wide_bank, WIDE_FAMILIES
    if which == "history":
        cfg = profile.section(BankConfig, "history_bank", **overrides)
        if cfg.seed == profile.section(BankConfig, "bank").seed:
            raise ConfigError(f"{profile.path} [history_bank]: seed {cfg.seed} is the main bank's; the history "
                              "pool must be other runs than those the evaluation scores")
        return cfg, paths.history_bank, FAMILIES
    if which != "main":
        raise ValueError(f"unknown bank {which!r}; known: {list(BANKS)}")
    return profile.section(BankConfig, "bank", **overrides), paths.bank, FAMILIES


def ensure_wide_bank(profile: Profile, progress: bool = True) -> Path:
    """The profile's wide bank, built first if missing."""
    cfg, path, families = bank_spec(profile, "wide")
    return ensure_bank(cfg, path, progress, families)


def ensure_history_bank(profile: Profile, progress: bool = True) -> Path | None:
    """The profile's history bank, built first if missing; None when the profile has no
    `[history_bank]` (its history methods are then not run)."""
    if not profile.values("history_bank"):
        return None
    cfg, path, families = bank_spec(profile, "history")
    return ensure_bank(cfg, path, progress, families)


def profile_bank(profile: Profile, path: str | Path | None = None, build: bool = True) -> Path:
    """`path` if given; else the profile's bank, built first if it is missing and `build`."""
    if path:
        return Path(path)
    return ensure_bank(profile.section(BankConfig, "bank"), profile.paths.bank) if build else profile.paths.bank
