"""Probe: the recall predictor's gates, chosen by family-held-out validation.

The recall predictor (docs/design.md §5.6) answers a task from the memory runs of
the kind it recognises, and leaves to FM a task whose nearest runs had to be
moved far (`max_shift`) or still lie far (`max_distance`). Loose gates help on
kinds the memory holds and hurt on kinds it does not, where the kind reader
still names some remembered kind. Both are measured on ID validation curves
only, with the evaluation protocol's queries (`eval_predictor.make_queries`):
- known: every ID val query, the full memory;
- unseen: each ID family in turn removed from the memory (and from the kind
  kind reader), scored on that family's val queries.
  FM itself was trained on that family, so this side flatters FM: the gates
  it picks are, if anything, too careful.
The pick is the pair with the lowest mean of the two capped MAEs.

Run from the project root:

    python -m experiments.probes.recall_probe

Writes experiments/probes/results/recall_probe.md, or into --out.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from experiments.probes.common import capped_mae, probe_parser, save_table
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_fm.bank import CurveSet, load_bank
from mara_fm.eval_predictor import Queries, make_queries, reference_curves, score
from mara_fm.fm_data import split_curves
from mara_fm.predictors import FMPredictor, RecallPredictor, SampledPredictor, WLSPredictor
from mara_fm.predictors.recall import KindReader, RecallConfig, load_memory


def floats(text: str) -> list[float]:
    return comma_list(text, "--shifts/--distances/--novelties", float)


def without(curves: CurveSet, family: str) -> CurveSet:
    keep = curves.families != family
    return CurveSet(*(getattr(curves, f.name)[keep] for f in dataclasses.fields(CurveSet)))


def gate_scores(memory: CurveSet, fm: SampledPredictor, q: Queries, gates: list[RecallConfig]
                ) -> list[tuple[float, float]]:
    """Per gate setting: the recall predictor's capped MAE on `q` and the share the memory answers.
    The kinds, the nearest runs and both answers are computed once (every query is past warm-up
    and above ε); a setting only chooses, per query, the memory's crossings or FM's."""
    predictor = RecallPredictor(memory, fm)
    match = predictor.match(q.hist)
    from_memory = predictor.crossings(match, ~np.isnan(match.shift), q.hist, q.eps, q.horizon)
    from_fm = fm.sorted_crossings(q.hist, q.eps, q.horizon)
    out = []
    for cfg in gates:
        answered = cfg.admits(match)
        crossings = np.where(answered[:, None], from_memory, from_fm)
        estimate = np.clip(np.median(crossings, axis=1), 0.0, q.horizon)
        out.append((score(estimate, q)["capped_mae"], float(answered.mean())))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = probe_parser(__doc__, fm=True)
    parser.add_argument("--shifts", type=floats, default=[0.05, 0.1, 0.2, 0.3, np.inf])
    parser.add_argument("--distances", type=floats, default=[0.001, 0.003, 0.01, np.inf])
    args = parser.parse_args(argv)
    profile = Profile.load(args.profile)
    fm_dir = args.fm or profile.paths.predictor
    fm, memory = FMPredictor.load(fm_dir), load_memory(fm_dir)
    train, val = split_curves(load_bank(args.bank or profile.paths.bank))
    q = make_queries(val, reference_curves(val, train))
    pairs = list(itertools.product(args.shifts, args.distances))
    gates = [RecallConfig(max_shift=s, max_distance=d) for s, d in pairs]

    kinds = KindReader(memory)(q.hist)
    print(f"known: {len(q)} queries, kind named right at {np.mean(kinds == q.hist.kind):.1%}", flush=True)
    known = gate_scores(memory, fm, q, gates)
    folds = []  # per family: its query count and gate scores
    for family in val.family_names():
        rows = np.flatnonzero(q.hist.kind == family)
        folds.append((len(rows), gate_scores(without(memory, family), fm, q.subset(rows), gates)))
        print(f"unseen {family}: {len(rows)} queries", flush=True)
    weights = np.array([n for n, _ in folds]) / len(q)
    unseen = [tuple(float(np.dot(weights, [f[g][i] for _, f in folds])) for i in range(2))
              for g in range(len(gates))]
    base = capped_mae(WLSPredictor(), q)
    fm_mae = capped_mae(fm, q)
    table = [(s, d, *known[g], *unseen[g]) for g, (s, d) in enumerate(pairs)]
    best = min(range(len(table)), key=lambda g: (table[g][2] + table[g][4]) / 2)
    lines = [f"ID val ({len(val)} curves, {len(q)} queries; WLS capped MAE {base:.2f}, FM "
             f"{fm_mae:.2f} on both sides). Memory: {len(memory)} runs of "
             f"{len(memory.family_names())} kinds; unseen: each of the {len(val.family_names())} ID families "
             "left out of it in turn. Defaults: " + str(RecallConfig()), "",
             "| max_shift | max_distance | known MAE | vs WLS | from memory | unseen MAE | from memory | mean |",
             "|---|---|---|---|---|---|---|---|"]
    for g, (s, d, km, ku, um, uu) in enumerate(table):
        lines.append(f"| {s:g} | {d:g} | {km:.2f} | {km / base - 1:+.1%} | {ku:.0%} | {um:.2f} | {uu:.0%} | "
                     f"{(km + um) / 2:.2f}{' (picked)' if g == best else ''} |")
    print("\n".join(lines), flush=True)
    save_table(lines, args.out, "recall_probe.md")


if __name__ == "__main__":
    main()
