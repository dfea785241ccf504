"""Choose the FM predictor's capacity and training length by family-held-out validation.

ID validation curves come from the same families as the training curves, so
they reward fitting those families closely; the OOD sets ask for forecasts of
families the network never saw, and there a closer fit did worse
(docs/decisions.md, "Predictor"). This script holds two ID families out of training
(`PredictorConfig.heldout_families`; their train and val curves become the
validation set, their test curves stay unused), trains every candidate on
the remaining six, and reads the held-out capped MAE after the *last* epoch,
since the final predictor is trained to completion on all eight families.

Rule, fixed before any candidate was trained: the lowest held-out MAE wins;
among the candidates within 2% of it, the one with the fewest parameters,
then the fewest epochs; a winner on the edge of the grid extends the grid one
step past that edge (the first grid, default and small networks × 25, 50 and
100 epochs, picked small × 25, so tiny networks and 12 epochs were added;
with the prior and the wide families the default network won at 25 epochs, so
the large network and 12 and 50 epochs were added; a network above the large one
would miss FM's speed target, docs/experiments.md, "A larger network"). No
OOD set is read here: the winner is scored once with `mara eval-predictor`
after it is retrained on every ID family.

With `--folds` several groups of families are held out in turn (each
candidate trained once per fold; the rule reads the mean held-out MAE over
the folds), and `--priors` adds the synthetic curve prior
(`PredictorConfig.prior`: off, pretrain, mixture) as a dimension of the grid;
among candidates within 2% of the best, no prior is preferred to one, and
pre-training to the mixture (less training time). `--data id,wide` adds the
training families as a dimension: the ID families only, or with the wide
bank's eight (`PredictorConfig.wide_families`; among near-ties ID only, the
smaller training set, is preferred). Folds may hold out wide families; a
candidate trained without them is scored on the same held-out curves, so
every candidate of a fold answers the same question: forecasts for families
it never saw. `--inputs level,interval,interval16,no-lr,points24` adds the
inputs (`PredictorConfig.interval_window`: the four level features, or a 5th
of interval means over at least 1 or 16 batches; `PredictorConfig.lr_input`:
no-lr leaves log lr out of the static inputs; points24: the GRU reads up to
24 thinned points, the 12 latest among them, instead of 12 and 6,
`PredictorConfig.max_points`, `recent_points`); among near-ties the fewer
parameters win (so no-lr), then the four history features, then the fewer
GRU steps (the cheaper forecast). `--prior-curves
6000` tries another size of the synthetic prior
(`PredictorConfig.prior_curves`; among near-ties the fewer curves, the
shorter training, are preferred). `--members 1,3` adds deep ensembles: a
candidate trained with K seeds (the profile's seed and the next K−1), its
members' sampled crossings pooled (`EnsembleFM`, named `…-e3`); it counts K
times the parameters, so among near-ties one network is preferred. `--seeds 3`
trains each candidate (each ensemble) three times with different seeds (the
profile's seed and the next ones; replicate r of a K-member ensemble takes the
K seeds after replicate r−1's) and the rule reads the mean over seeds: one
training seed moves the held-out MAE by about 5% (docs/experiments.md, "A deep
ensemble of FM"), more than the 2% tolerance.

The held-out MAE is computed here from each candidate's last checkpoint with
the config's sampling settings, on the held-out families' train + val curves
(the val MAE that training logs for the same curves, when they are its val
set); a fold's training therefore skips the export's sampling sweep, whose
choice is never read here.

Trains with the profile's [predictor] settings, logging to MLflow (each
candidate's folder under --work resumes). Run from the project root:

    python -m experiments.probes.select_predictor --work /tmp/hsel

Writes experiments/probes/results/select_predictor.md, or into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from experiments.probes.common import capped_mae, probe_parser, save_table
from mara_common.flags import comma_list
from mara_common.profile import Profile
from mara_fm.bank import CurveSet, load_bank
from mara_fm.build_bank import ensure_wide_bank
from mara_fm.eval_predictor import Queries, make_queries, reference_curves
from mara_fm.fm_data import split_curves
from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.predictors import FMPredictor, SampledPredictor
from mara_fm.predictors.base import HistoryBatch
from mara_fm.predictors.recall import load_memory
from mara_fm.targets import Stats
from mara_fm.train_predictor import train_predictor
from mara_fm.wide_families import WIDE_FAMILIES

# Held out: the two ID families whose cumulative averages rise most often
# (docs/decisions.md), the property that sets the DQN TD losses apart from every ID family.
HELDOUT = ("mlp_diabetes", "logreg_cancer")
PRIOR_COST = {"off": 0, "pretrain": 1, "mixture": 2}
DATA = {"id": False, "wide": True}  # --data value -> PredictorConfig.wide_families
# --inputs value -> the PredictorConfig settings of that encoding
INPUTS = {"level": {"interval_window": 0}, "interval": {"interval_window": 1}, "interval16": {"interval_window": 16},
          "no-lr": {"interval_window": 0, "lr_input": False},
          "points24": {"interval_window": 0, "max_points": 24, "recent_points": 12}}
NETWORKS = {"large": {"gru_hidden": 64, "context_dim": 96, "width": 128},
            "default": {"gru_hidden": 32, "context_dim": 48, "width": 64},
            "small": {"gru_hidden": 16, "context_dim": 24, "width": 32},
            "tiny": {"gru_hidden": 8, "context_dim": 12, "width": 16}}
EPOCHS = (12, 25, 50, 100)
TOLERANCE = 0.02


def candidates(networks: list[str], epochs: list[int], priors: list[str],
               data: tuple[str, ...] = ("id",), inputs: tuple[str, ...] = ("level",),
               prior_sizes: tuple[int | None, ...] = (None,)) -> dict[str, dict[str, Any]]:
    """Every network × training length × prior × training families × history inputs × prior
    size, named like `s25` (small, 25 epochs, no prior, ID families, the four level features),
    `s25-mixture`, `s25-mixture-wide`, `s25-mixture-wide-interval` or `s25-mixture-wide-x6000`
    (6,000 synthetic curves; None: the profile's number, no suffix)."""
    return {f"{size[0]}{n}" + ("" if prior == "off" else f"-{prior}") + ("-wide" if DATA[d] else "")
            + ("" if i == "level" else f"-{i}") + ("" if k is None else f"-x{k}"):
            {**NETWORKS[size], "max_epochs": n, "prior": prior, "wide_families": DATA[d],
             **INPUTS[i], **({} if k is None else {"prior_curves": k})}
            for size in networks for n in epochs for prior in priors for d in data for i in inputs
            for k in prior_sizes}


def parameters(profile: Profile, overrides: dict[str, Any]) -> int:
    return sum(p.numel() for p in FlowModel(profile.section(PredictorConfig, "predictor", **overrides)).parameters())


class EnsembleFM(SampledPredictor):
    """FM networks trained alike but for their seed, their sampled crossings pooled and sorted: a
    deep ensemble (Lakshminarayanan et al., NeurIPS 2017), whose spread also carries where the
    members disagree, as they may on families none of them saw. Median and order statistic are
    read from the pooled samples (M = the members' sum)."""

    def __init__(self, members: list[SampledPredictor]) -> None:
        self.members = members

    @property
    def samples(self) -> int:
        return sum(m.samples for m in self.members)

    def sorted_crossings(self, hist: HistoryBatch, eps: np.ndarray, horizon: np.ndarray) -> np.ndarray:
        return np.sort(np.concatenate([m.sorted_crossings(hist, eps, horizon) for m in self.members], axis=1),
                       axis=1)

    def resampled(self, sampler_seed: int) -> EnsembleFM:
        return EnsembleFM([m.resampled(sampler_seed) for m in self.members])


def ensemble(members: list[FMPredictor]) -> SampledPredictor:
    return members[0] if len(members) == 1 else EnsembleFM(members)


def member_runs(sel: Selection, name: str, members: int, replicate: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """(folder name, overrides) of each of candidate `name`'s `members` networks in training
    replicate `replicate`: the profile's seed plus replicate·members, +1, +2, …; the network at
    the profile's seed is the candidate itself, the others are named by their seed."""
    base = sel.profile.section(PredictorConfig, "predictor").seed
    seeds = [base + replicate * members + i for i in range(members)]
    return [(name, sel.grid[name]) if seed == base else (f"{name}-seed{seed}", {**sel.grid[name], "seed": seed})
            for seed in seeds]


def label(name: str, members: int) -> str:
    return name if members == 1 else f"{name}-e{members}"


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule of the module docstring."""
    best = min(r["mae"] for r in rows)
    return min((r for r in rows if r["mae"] <= best * (1 + TOLERANCE)),
               key=lambda r: (r["params"], r["epochs"], PRIOR_COST[r["prior"]], r["prior_curves"], r["wide"],
                              r["window"], r["points"]))


def last_checkpoint(folder: Path, cfg: PredictorConfig, stats: Stats) -> FMPredictor:
    """The predictor of the last epoch trained in `folder` (not the export, whose checkpoint and
    sampling were chosen on its own val curves: the held-out ones, for a wide candidate), with
    the run's normalisation `stats` (the export carries them)."""
    model = FlowModel(cfg)
    state = torch.load(folder / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    return FMPredictor(model.eval(), cfg, stats)


def heldout_curves(frame: pd.DataFrame, fold: tuple[str, ...]) -> CurveSet:
    """The `fold` families' train + val curves of `frame` (their test curves stay unread)."""
    return split_curves(frame, fold)[1]


def heldout_queries(curves: CurveSet) -> Queries:
    """The project's evaluation queries (eval_predictor.py) on a fold's held-out `curves`."""
    return make_queries(curves, reference_curves(curves, None))


def fold_run(work: Path, name: str, overrides: dict[str, Any], fold: tuple[str, ...]) -> tuple[Path, tuple[str, ...]]:
    """(training folder, families held out of its training) of candidate `name` in `fold`: the
    fold's families that this candidate would otherwise train on."""
    held = tuple(f for f in fold if overrides["wide_families"] or f not in WIDE_FAMILIES)
    return work / (name if not held else f"{name}-{'+'.join(held)}"), held


def add_grid_flags(parser: argparse.ArgumentParser) -> None:
    """The candidate grid and the folds: the same flags here and in unseen_families_probe.py."""
    parser.add_argument("--work", type=Path, required=True, help="one training folder per candidate (resumed)")
    parser.add_argument("--networks", default=",".join(NETWORKS),
                        help=f"network sizes tried, comma-separated (of {', '.join(NETWORKS)})")
    parser.add_argument("--epochs", default=",".join(map(str, EPOCHS)),
                        help="training lengths tried, comma-separated")
    parser.add_argument("--priors", default="off", help="curve-prior modes tried: off, pretrain, mixture")
    parser.add_argument("--data", default="id", help="training families tried: id, wide (ID + the wide bank's)")
    parser.add_argument("--inputs", default="level",
                        help="inputs tried: level (the four history features, four static ones), interval or "
                             "interval16 (+ interval means over at least 1 or 16 batches), no-lr (the static "
                             "inputs without log lr), points24 (the GRU reads up to 24 points, the 12 latest "
                             "among them)")
    parser.add_argument("--prior-curves", default="",
                        help="synthetic prior sizes tried, comma-separated (default: the profile's)")
    parser.add_argument("--members", default="1",
                        help="ensemble sizes tried, comma-separated (K networks with consecutive seeds, pooled)")
    parser.add_argument("--sampling", default="",
                        help="M,S: the fold predictors draw M crossings with S Euler steps (default: the training "
                             "config's; an export chooses its own on ID val, e.g. 16,2 for today's)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="training replicates per candidate, each with its own seeds; the rule reads their mean")
    parser.add_argument("--folds", default="+".join(HELDOUT),
                        help="held-out family groups, each FAMILY+FAMILY..., comma-separated (one fold each)")


@dataclass(frozen=True)
class Selection:
    """What a selection run reads: the profile, both banks, the candidates by name, the folds, the
    ensemble sizes and the number of training replicates (seeds) of each."""

    profile: Profile
    bank: Path
    wide_bank: Path
    grid: dict[str, dict[str, Any]]
    folds: list[tuple[str, ...]]
    members: tuple[int, ...] = (1,)
    seeds: int = 1
    sampling: tuple[int, int] | None = None  # (M, Euler steps) of the fold predictors; None: their config's

    @property
    def trained_as(self) -> list[tuple[str, int]]:
        """(candidate, ensemble size) of every predictor the selection scores."""
        return [(name, k) for name in self.grid for k in self.members]

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        """Both banks' curves, loaded once."""
        return pd.concat([load_bank(self.bank), load_bank(self.wide_bank)], ignore_index=True)


def parse_selection(parser: argparse.ArgumentParser, argv: list[str] | None
                    ) -> tuple[argparse.Namespace, Selection]:
    """Parse the command line (a `probe_parser` with `add_grid_flags`) into the arguments and
    the `Selection` they name; the wide bank is built if missing."""
    args = parser.parse_args(argv)

    networks, priors, data, inputs = (comma_list(getattr(args, name), f"--{name}")
                                      for name in ("networks", "priors", "data", "inputs"))
    if not networks or set(networks) - set(NETWORKS):
        parser.error(f"--networks: choose from {list(NETWORKS)}")
    if not priors or set(priors) - set(PRIOR_COST):
        parser.error(f"--priors: choose from {list(PRIOR_COST)}")
    if not data or set(data) - set(DATA):
        parser.error(f"--data: choose from {list(DATA)}")
    if not inputs or set(inputs) - set(INPUTS):
        parser.error(f"--inputs: choose from {list(INPUTS)}")
    sizes = tuple(comma_list(args.prior_curves, "--prior-curves", int)) or (None,)
    members = tuple(comma_list(args.members, "--members", int))
    if not members or min(members) < 1:
        parser.error("--members: ensemble sizes of at least 1, comma-separated")
    if args.seeds < 1:
        parser.error("--seeds: at least 1 training replicate per candidate")
    sampling = tuple(comma_list(args.sampling, "--sampling", int)) or None
    if sampling is not None and (len(sampling) != 2 or min(sampling) < 1):
        parser.error("--sampling: M,S, two positive integers (samples, Euler steps)")
    grid = candidates(networks, comma_list(args.epochs, "--epochs", int), priors, tuple(data), tuple(inputs), sizes)
    profile = Profile.load(args.profile)
    folds = [tuple(f.split("+")) for f in comma_list(args.folds, "--folds")]
    return args, Selection(profile, args.bank or profile.paths.bank, ensure_wide_bank(profile), grid, folds,
                           members, args.seeds, sampling)


def fold_predictor(sel: Selection, work: Path, name: str, fold: tuple[str, ...], members: int = 1,
                   replicate: int = 0) -> SampledPredictor:
    """Candidate `name` (an ensemble of `members`, training replicate `replicate`) trained without
    the fold's families (resumed if trained), as its last checkpoint, sampled as `sel.sampling` says."""
    trained = []
    for run, overrides in member_runs(sel, name, members, replicate):
        folder, held = fold_run(work, run, overrides, fold)
        cfg = sel.profile.section(PredictorConfig, "predictor", heldout_families=held, **overrides)
        result = train_predictor(sel.profile, sel.bank, folder, verbose=False, heldout_families=held,
                                 sample_choices=(cfg.samples,), step_choices=(cfg.euler_steps,), **overrides)
        scored = cfg if sel.sampling is None else dataclasses.replace(cfg, samples=sel.sampling[0],
                                                                      euler_steps=sel.sampling[1])
        trained.append(last_checkpoint(folder, scored, FMPredictor.load(result.predictor_path).stats))
    return ensemble(trained)


def only_candidate(parser: argparse.ArgumentParser, sel: Selection) -> str:
    """The name of the one candidate a probe of a chosen predictor reads (an error otherwise)."""
    if len(sel.grid) != 1:
        parser.error("name one candidate (one network, epochs, prior, data)")
    (name,) = sel.grid
    return name


@dataclass(frozen=True)
class HeldOutFold:
    """Candidate `name` in one fold, as the probes of a chosen predictor read it."""

    fm: SampledPredictor  # trained without the fold's families (last checkpoint)
    memory: CurveSet  # that training's own runs, saved beside its export: recall's memory
    curves: CurveSet  # the held-out families' train + val curves


def held_out_fold(sel: Selection, work: Path, name: str, fold: tuple[str, ...]) -> HeldOutFold:
    """Candidate `name` in `fold` (trained first if it is not yet)."""
    fm = fold_predictor(sel, work, name, fold)
    return HeldOutFold(fm, load_memory(fold_run(work, name, sel.grid[name], fold)[0] / "predictor"),
                       heldout_curves(sel.frame, fold))


def full_predictor(sel: Selection, work: Path, name: str, members: int = 1, replicate: int = 0) -> SampledPredictor:
    """Candidate `name` (an ensemble of `members`, training replicate `replicate`) trained on every
    family it may use and exported as `train-predictor` exports it (resumed if trained)."""
    return ensemble([FMPredictor.load(train_predictor(sel.profile, sel.bank, work / run, verbose=False,
                                                      **overrides).predictor_path)
                     for run, overrides in member_runs(sel, name, members, replicate)])


def main(argv: list[str] | None = None) -> Path:
    parser = probe_parser(__doc__)
    add_grid_flags(parser)
    args, sel = parse_selection(parser, argv)
    queries = {fold: heldout_queries(heldout_curves(sel.frame, fold)) for fold in sel.folds}
    rows = []
    for name, k in sel.trained_as:
        overrides, maes = sel.grid[name], np.zeros((sel.seeds, len(sel.folds)))
        cfg = sel.profile.section(PredictorConfig, "predictor", **overrides)
        for r in range(sel.seeds):
            for j, fold in enumerate(sel.folds):
                maes[r, j] = capped_mae(fold_predictor(sel, args.work, name, fold, k, r), queries[fold])
                print(f"[select] {label(name, k)} replicate {r} fold {'+'.join(fold)}: "
                      f"held-out MAE {maes[r, j]:.2f}", flush=True)
        rows.append({"name": label(name, k), "epochs": overrides["max_epochs"], "prior": overrides["prior"],
                     "wide": overrides["wide_families"], "window": overrides["interval_window"],
                     "prior_curves": cfg.prior_curves, "points": cfg.max_points,
                     "mae": float(maes.mean()), "folds": maes.mean(axis=0), "seeds": maes.mean(axis=1),
                     "params": k * parameters(sel.profile, overrides)})
    choice = choose(rows)
    lines = [f"Held-out folds: {'; '.join(', '.join(f) for f in sel.folds)}. Capped MAE of the last checkpoint on "
             f"the held-out families' train + val curves, the mean over folds and {sel.seeds} training "
             "replicate(s); per fold: the mean over replicates; per replicate: each replicate's mean over folds"
             + ("." if sel.sampling is None else
                f"; fold predictors draw {sel.sampling[0]} crossings with {sel.sampling[1]} Euler steps."), "",
             "| candidate | parameters | epochs | prior | wide families | held-out MAE | per fold | per replicate | chosen |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['params']:,} | {r['epochs']} | {r['prior']} | {'yes' if r['wide'] else 'no'} | "
              f"{r['mae']:.2f} | {' / '.join(f'{x:.2f}' for x in r['folds'])} | "
              f"{' / '.join(f'{x:.2f}' for x in r['seeds'])} | {'yes' if r is choice else ''} |" for r in rows]
    print("\n".join(lines))
    return save_table(lines, args.out, "select_predictor.md")


if __name__ == "__main__":
    main()
