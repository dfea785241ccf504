"""Probe: the recall predictor's gates on families that neither FM nor the memory saw.

`recall_probe.py` scores its unseen side with the exported FM, which was
trained on every family, as the fallback, so a family left out of the memory
is still known to FM. Here both are held out: the folds of
`select_predictor.py`, each fold's FM (its last checkpoint, trained without
the fold's families) as the fallback and each fold's own training runs (saved
beside its export) as the memory. The known side is `recall_probe.py`'s: ID val
curves, the full memory and the exported FM.

Rule, the same as `recall_probe.py`'s: the gate setting with the lowest mean of
the known capped MAE and the unseen one (the mean over folds). No test or OOD
curve is read.

With `--teacher`, the scheduler's consequence as `unseen_families_probe.py`
measures it: the teacher (`lara_optimistic`) on each fold's episodes of the
held-out families (`--roots` × `--episodes-per-root`, the profile's load), fed
by the fold's FM alone, by recall at the defaults and by recall at the pick,
and on the ID val episodes with the exported FM and memory; `weighted` counts
ID val once and the unseen folds twice, as the test mean counts the ID set and
the two OOD sets.

    python -m experiments.probes.recall_folds_probe --work WORK --networks small --epochs 25 \\
        --priors mixture --data wide --folds F1,F2,...

WORK as for `select_predictor.py` (fold trainings are resumed). Writes
experiments/probes/results/recall_folds_probe.md, or into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path

import numpy as np

from experiments.probes.common import capped_mae, probe_parser, save_table, success
from experiments.probes.recall_probe import floats, gate_scores
from experiments.probes.select_predictor import (
    HeldOutFold,
    Selection,
    add_grid_flags,
    held_out_fold,
    heldout_queries,
    only_candidate,
    parse_selection,
)
from experiments.probes.unseen_families_probe import heldout_bank
from mara_common.threads import torch_threads
from mara_env.env import EnvConfig
from mara_fm.bank import CurveSet, load_bank
from mara_fm.eval_predictor import make_queries, reference_curves
from mara_fm.fm_data import split_curves
from mara_fm.predictors import FMPredictor, RecallPredictor, WLSPredictor
from mara_fm.predictors.recall import RecallConfig, load_memory
from mara_rl.evaluate import pooled_episodes


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__, fm=True)
    add_grid_flags(parser)
    parser.add_argument("--shifts", type=floats, default=[0.05, 0.1, 0.2, 0.3, np.inf])
    parser.add_argument("--distances", type=floats, default=[0.0005, 0.001, 0.0015, 0.002, 0.003, 0.01, np.inf])
    parser.add_argument("--novelties", type=floats, default=[np.inf],
                        help="the kind reader's gate (RecallConfig.max_novelty), comma-separated")
    parser.add_argument("--teacher", action="store_true",
                        help="also run the teacher on each fold's held-out episodes and on ID val")
    parser.add_argument("--roots", type=int, default=5)
    parser.add_argument("--episodes-per-root", type=int, default=8)
    args, sel = parse_selection(parser, argv)
    name = only_candidate(parser, sel)
    gates = [RecallConfig(max_shift=s, max_distance=d, max_novelty=v)
             for s, d, v in itertools.product(args.shifts, args.distances, args.novelties)]

    fm_dir = args.fm or sel.profile.paths.predictor
    train, val = split_curves(load_bank(sel.bank))
    q = make_queries(val, reference_curves(val, train))
    fm, memory = FMPredictor.load(fm_dir), load_memory(fm_dir)
    known = [mae for mae, _ in gate_scores(memory, fm, q, gates)]
    base = capped_mae(WLSPredictor(), q)
    fm_known = capped_mae(fm, q)

    unseen, answered, fm_unseen = [], [], []
    parts = {fold: held_out_fold(sel, args.work, name, fold) for fold in sel.folds}
    for fold, part in parts.items():
        fq = heldout_queries(part.curves)
        scored = gate_scores(part.memory, part.fm, fq, gates)
        unseen.append([mae for mae, _ in scored])
        answered.append([share for _, share in scored])
        fm_unseen.append(capped_mae(part.fm, fq))
        print(f"[recall folds] {'+'.join(fold)}: FM {fm_unseen[-1]:.2f}, recall {min(unseen[-1]):.2f} to "
              f"{max(unseen[-1]):.2f} over the gates", flush=True)
    unseen_mae, share = np.mean(unseen, axis=0), np.mean(answered, axis=0)
    best = int(np.argmin((np.array(known) + unseen_mae) / 2))
    lines = [f"Known: ID val ({len(q)} queries; WLS {base:.2f}, FM {fm_known:.2f}), the full memory and FM. "
             f"Unseen: folds {'; '.join('+'.join(f) for f in sel.folds)}, each fold's FM ({name}, trained without "
             f"them; mean capped MAE {np.mean(fm_unseen):.2f}) and memory. Defaults: {RecallConfig()}.", "",
             "| max_shift | max_distance | max_novelty | known MAE | vs WLS | unseen MAE | vs fold FM "
             "| unseen from memory | mean |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g, c in enumerate(gates):
        lines.append(f"| {c.max_shift:g} | {c.max_distance:g} | {c.max_novelty:g} | {known[g]:.2f} | {known[g] / base - 1:+.1%} | {unseen_mae[g]:.2f} | "
                     f"{unseen_mae[g] / np.mean(fm_unseen) - 1:+.1%} | {share[g]:.0%} | "
                     f"{(known[g] + unseen_mae[g]) / 2:.2f}{' (picked)' if g == best else ''} |")
    if args.teacher:
        lines += ["", *teacher_lines(args, sel, parts, fm, memory, gates[best])]
    print("\n".join(lines), flush=True)
    return save_table(lines, args.out, "recall_folds_probe.md")


def teacher_lines(args: argparse.Namespace, sel: Selection, parts: dict[tuple[str, ...], HeldOutFold],
                  fm: FMPredictor, memory: CurveSet, pick: RecallConfig) -> list[str]:
    """The teacher's success with FM alone, recall at the defaults and recall at `pick`: on each
    fold's held-out episodes (that fold's FM and memory) and on ID val (the exported ones)."""
    feeds = {"FM": lambda f, m: f, "recall, defaults": lambda f, m: RecallPredictor(m, f),
             "recall, pick": lambda f, m: RecallPredictor(m, f, pick)}
    base = sel.profile.section(EnvConfig, "env", split="val", task_set="heldout")
    unseen: dict[str, list[float]] = {k: [] for k in feeds}
    with torch_threads(1):
        for fold, part in parts.items():
            path = heldout_bank(sel.frame, part.curves, args.work / f"heldout-{'+'.join(fold)}.parquet")
            cfg = dataclasses.replace(base, bank=str(path))
            episodes = pooled_episodes(cfg, args.roots, args.episodes_per_root)
            for k, feed in feeds.items():
                unseen[k].append(success(cfg, episodes, feed(part.fm, part.memory)))
            print(f"[recall folds] teacher on {'+'.join(fold)}: "
                  + ", ".join(f"{k} {v[-1]:.2f}" for k, v in unseen.items()), flush=True)
        id_val = sel.profile.section(EnvConfig, "env", bank=str(sel.bank), split="val", task_set="id")
        id_episodes = pooled_episodes(id_val, args.roots, args.episodes_per_root)
        on_id = {k: success(id_val, id_episodes, feed(fm, memory)) for k, feed in feeds.items()}
    lines = [f"The teacher (success %), {args.roots} x {args.episodes_per_root} episodes per fold and on ID val; "
             f"pick: {pick}.", "",
             "| forecasts | unseen, mean (per fold) | ID val | weighted |", "|---|---|---|---|"]
    for k in feeds:
        folds = " / ".join(f"{x:.1f}" for x in unseen[k])
        weighted = (on_id[k] + 2 * np.mean(unseen[k])) / 3
        lines.append(f"| {k} | {np.mean(unseen[k]):.2f} ({folds}) | {on_id[k]:.2f} | {weighted:.2f} |")
    return lines


if __name__ == "__main__":
    main()
