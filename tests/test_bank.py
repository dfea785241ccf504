import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from mara_common.config import ConfigError
from mara_common.threads import torch_threads
from mara_fm.bank import BankError, bank_digest, load_bank, save_bank, select
from mara_fm.build_bank import EVERY_FAMILY, BankConfig, build_bank, ensure_bank, plan
from mara_fm.families import FAMILIES
from mara_fm.wide_families import WIDE_FAMILIES


def _frame(smoke_bank, n=3):
    return load_bank(smoke_bank).head(n).copy()


def test_smoke_bank_follows_schema(smoke_bank):
    frame = load_bank(smoke_bank)
    assert set(frame["task_set"]) == {"id", "rl_ood", "vit_ood"}
    assert frame.loc[frame.task_set == "id", "family"].nunique() == 8
    id_models = frame.loc[frame.task_set == "id", "dataset"].nunique()
    assert id_models >= 6
    curves = select(frame, "id", "train")
    assert curves.losses.shape[1] == 300 and np.all(curves.losses > 0)
    # ID curves are split by curve: no curve id in two splits.
    assert frame.groupby("curve_id")["split"].nunique().max() == 1
    assert set(frame.loc[frame.task_set != "id", "split"]) == {"test"}


@pytest.mark.parametrize(
    "corrupt, words",
    [
        (lambda f: f.drop(columns=["lr"]), ["missing column", "lr"]),
        (lambda f: f.assign(losses=[np.r_[np.nan, x[1:]] for x in f.losses]), ["losses", "NaN"]),
        (lambda f: f.assign(losses=[np.r_[0.0, x[1:]] for x in f.losses]), ["losses", "<= 0"]),
        (lambda f: f.assign(losses=[x[:-5] if i == 1 else x for i, x in enumerate(f.losses)]),
         ["losses", "length"]),
    ],
)
def test_malformed_bank_names_file_column_and_curve(smoke_bank, tmp_path, corrupt, words):
    bad = corrupt(_frame(smoke_bank))
    path = tmp_path / "bad.parquet"
    bad.to_parquet(path)  # written without validation, as a foreign tool would
    with pytest.raises(BankError) as err:
        load_bank(path)
    msg = str(err.value)
    assert str(path) in msg
    for w in words:
        assert w in msg
    if "missing" not in msg:
        assert any(cid in msg for cid in bad["curve_id"])


def test_missing_bank_file_is_a_clear_error(tmp_path):
    with pytest.raises(BankError, match="not found"):
        load_bank(tmp_path / "nope.parquet")


def test_runs_are_deterministic_per_seed_and_vary_across_seeds():
    fam = FAMILIES["logreg_cancer"]
    a, b, c = fam.run(7, 50), fam.run(7, 50), fam.run(8, 50)
    np.testing.assert_array_equal(a["losses"], b["losses"])
    assert (a["batch_size"], a["lr"]) == (b["batch_size"], b["lr"])
    assert not np.array_equal(a["losses"], c["losses"])


def test_a_run_gives_its_curve_whatever_thread_count_the_caller_runs_with():
    """Bank chunks are built in single-threaded workers, probes retrain runs in their own process:
    unpinned, `mlp_digits` on two threads differs from one thread in the last bits of a batch's loss."""
    fam = FAMILIES["mlp_digits"]
    runs = []
    for threads in (1, 2):
        with torch_threads(threads):
            runs.append(fam.run(3, 40)["losses"])
            assert torch.get_num_threads() == threads  # the caller's setting is left as it was
    np.testing.assert_array_equal(*runs)


def test_build_resumes_without_redoing_finished_chunks(tmp_path):
    cfg = BankConfig(curves_per_id_family=1, curves_per_ood_set=2, cap=20, workers=1)
    path = build_bank(cfg, tmp_path / "b.parquet", progress=False)
    first = load_bank(path)
    parts = sorted(path.with_suffix(".parts").glob("*.parquet"))
    kept = parts[0].stat().st_mtime_ns
    parts[-1].unlink()  # as if interrupted before the last chunk
    build_bank(cfg, path, progress=False)
    assert parts[0].stat().st_mtime_ns == kept
    pd.testing.assert_frame_equal(first, load_bank(path))
    assert len(first) == len(plan(cfg))
    # A build from scratch elsewhere writes the same bytes: what is keyed by a bank's digest
    # (a live batch's rows, a policy's inputs) survives rebuilding it on a new machine.
    assert bank_digest(build_bank(cfg, tmp_path / "again.parquet", progress=False)) == bank_digest(path)
    # Chunks of another config are refused, not mixed in; --fresh discards them.
    other = BankConfig(curves_per_id_family=1, curves_per_ood_set=2, cap=20, workers=1, seed=1)
    with pytest.raises(ValueError, match="another config.*--fresh"):
        build_bank(other, path, progress=False)
    build_bank(other, path, progress=False, fresh=True)
    assert not load_bank(path)["losses"].map(tuple).equals(first["losses"].map(tuple))
    # A finished bank is served only to the config it was built with (not its worker count).
    assert ensure_bank(dataclasses.replace(other, workers=2), path, progress=False) == path
    with pytest.raises(ConfigError, match=r"b\.parquet was built with another config.*--fresh"):
        ensure_bank(cfg, path, progress=False)


def test_save_bank_rejects_bad_frames(smoke_bank, tmp_path):
    bad = _frame(smoke_bank).assign(split="holdout")
    with pytest.raises(BankError, match="split"):
        save_bank(bad, tmp_path / "x.parquet")


def test_wide_families_are_split_like_id_families_and_built_into_their_own_bank(smoke_wide_bank):
    cfg = BankConfig(curves_per_id_family=20)
    jobs = plan(cfg, WIDE_FAMILIES)
    assert {f for f, _, _ in jobs} == set(WIDE_FAMILIES) and len(jobs) == 20 * len(WIDE_FAMILIES)
    for name in WIDE_FAMILIES:
        splits = [s for f, _, s in jobs if f == name]
        assert (splits.count("train"), splits.count("val"), splits.count("test")) == (14, 3, 3)
    assert not {f for f, _, _ in plan(cfg)} & set(WIDE_FAMILIES)  # the main bank stays as it was
    frame = load_bank(smoke_wide_bank)
    assert set(frame["family"]) == set(WIDE_FAMILIES) and set(frame["task_set"]) == {"wide"}
    training = [f for f in EVERY_FAMILY.values() if f.task_set in ("id", "wide")]
    assert len(training) >= 16
