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
100 epochs, picked small × 25, so tiny networks and 12 epochs were added). No
OOD set is read here: the winner is scored once with `mara eval-predictor`
after it is retrained on every ID family.

With `--folds` several pairs of families are held out in turn (each
candidate trained once per fold; the rule reads the mean held-out MAE over
the folds), and `--priors` adds the synthetic curve prior
(`PredictorConfig.prior`: off, pretrain, mixture) as a dimension of the grid;
among candidates within 2% of the best, no prior is preferred to one, and
pre-training to the mixture (less training time).

Trains with the profile's [predictor] settings, logging to MLflow (each
candidate's folder under --work resumes). Run from the project root:

    python -m experiments.probes.select_predictor --work /tmp/hsel

Writes experiments/probes/results/select_predictor.md, or into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import mlflow

from experiments.probes.common import add_common_flags, save_table
from mara_common.profile import Profile
from mara_common.tracking import tracking_uri
from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.train_predictor import train_predictor

# Held out: the two ID families whose cumulative averages rise most often
# (docs/decisions.md), the property that sets the DQN TD losses apart from every ID family.
HELDOUT = ("mlp_diabetes", "logreg_cancer")
PRIOR_COST = {"off": 0, "pretrain": 1, "mixture": 2}
NETWORKS = {"default": {"gru_hidden": 32, "context_dim": 48, "width": 64},
            "small": {"gru_hidden": 16, "context_dim": 24, "width": 32},
            "tiny": {"gru_hidden": 8, "context_dim": 12, "width": 16}}
EPOCHS = (12, 25, 50, 100)
TOLERANCE = 0.02


def candidates(networks: list[str], epochs: list[int], priors: list[str]) -> dict[str, dict[str, Any]]:
    """Every network × training length × prior, named like `s25` (small, 25 epochs, no prior)
    or `s25-mixture`."""
    return {f"{size[0]}{n}" + ("" if prior == "off" else f"-{prior}"): {**NETWORKS[size], "max_epochs": n,
                                                                       "prior": prior}
            for size in networks for n in epochs for prior in priors}


def parameters(profile: Profile, overrides: dict[str, Any]) -> int:
    return sum(p.numel() for p in FlowModel(profile.section(PredictorConfig, "predictor", **overrides)).parameters())


def choose(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule of the module docstring."""
    best = min(r["mae"] for r in rows)
    return min((r for r in rows if r["mae"] <= best * (1 + TOLERANCE)),
               key=lambda r: (r["params"], r["epochs"], PRIOR_COST[r["prior"]]))


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_flags(parser)
    parser.add_argument("--work", type=Path, required=True, help="one training folder per candidate (resumed)")
    parser.add_argument("--networks", default=",".join(NETWORKS),
                        help=f"network sizes tried, comma-separated (of {', '.join(NETWORKS)})")
    parser.add_argument("--epochs", default=",".join(map(str, EPOCHS)),
                        help="training lengths tried, comma-separated")
    parser.add_argument("--priors", default="off", help="curve-prior modes tried: off, pretrain, mixture")
    parser.add_argument("--folds", default="+".join(HELDOUT),
                        help="held-out family pairs, each FAMILY+FAMILY, comma-separated (one fold each)")
    args = parser.parse_args(argv)

    networks = [x.strip() for x in args.networks.split(",") if x.strip()]
    unknown = sorted(set(networks) - set(NETWORKS))
    if unknown or not networks:
        parser.error(f"--networks: unknown {unknown}; known: {list(NETWORKS)}")
    priors = [x.strip() for x in args.priors.split(",") if x.strip()]
    if not priors or set(priors) - set(PRIOR_COST):
        parser.error(f"--priors: choose from {list(PRIOR_COST)}")
    folds = [tuple(f.split("+")) for f in args.folds.split(",") if f.strip()]
    profile = Profile.load(args.profile)
    rows = []
    client = mlflow.MlflowClient(tracking_uri())
    for name, overrides in candidates(networks, [int(n) for n in args.epochs.split(",")], priors).items():
        last, best = [], []
        for fold in folds:
            folder = args.work / (name if len(folds) == 1 else f"{name}-{'+'.join(fold)}")
            result = train_predictor(profile, args.bank, folder, verbose=False, heldout_families=fold, **overrides)
            history = client.get_metric_history(result.run_id, "val_mae")
            last.append(max(history, key=lambda m: m.step).value)
            best.append(min(m.value for m in history))
        rows.append({"name": name, "epochs": overrides["max_epochs"], "prior": overrides["prior"],
                     "mae": sum(last) / len(last), "folds": last, "params": parameters(profile, overrides),
                     "best_epoch_mae": sum(best) / len(best)})
    choice = choose(rows)
    lines = [f"Held-out folds: {'; '.join(', '.join(f) for f in folds)}. Capped MAE on the held-out "
             "families' train + val curves, the mean over folds.", "",
             "| candidate | parameters | epochs | prior | held-out MAE, last epoch | per fold | best epoch | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['params']:,} | {r['epochs']} | {r['prior']} | {r['mae']:.2f} | "
              f"{' / '.join(f'{x:.2f}' for x in r['folds'])} | {r['best_epoch_mae']:.2f} | "
              f"{'yes' if r is choice else ''} |" for r in rows]
    print("\n".join(lines))
    return save_table(lines, args.out, "select_predictor.md")


if __name__ == "__main__":
    main()
