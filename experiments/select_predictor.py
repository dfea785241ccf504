"""Choose the FM predictor's capacity and training length by family-held-out validation.

ID validation curves come from the same families as the training curves, so
they reward fitting those families closely; the OOD sets ask for forecasts of
families the network never saw, and there a closer fit did worse (README,
stage one). This script holds two ID families out of training
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

    python experiments/select_predictor.py --work /tmp/hsel --out reports/default/selection
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mlflow

from mara_fm.fm_model import FlowModel, PredictorConfig
from mara_fm.profile import section_config
from mara_fm.tracking import tracking_uri
from mara_fm.train_predictor import train_predictor

# Held out: the two ID families whose cumulative averages rise most often (README,
# stage one), the property that sets the DQN TD losses apart from every ID family.
HELDOUT = ("mlp_diabetes", "logreg_cancer")
NETWORKS = {"default": {"gru_hidden": 32, "context_dim": 48, "width": 64},
            "small": {"gru_hidden": 16, "context_dim": 24, "width": 32},
            "tiny": {"gru_hidden": 8, "context_dim": 12, "width": 16}}
CANDIDATES = {f"{size[0]}{epochs}": {**net, "max_epochs": epochs}
              for size, net in NETWORKS.items() for epochs in (12, 25, 50, 100)}
TOLERANCE = 0.02


def parameters(profile: str, overrides: dict) -> int:
    return sum(p.numel() for p in FlowModel(section_config(PredictorConfig, profile, "predictor",
                                                           **overrides)).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--bank", type=Path, default=Path("data/banks/default.parquet"))
    parser.add_argument("--work", type=Path, required=True, help="one training folder per candidate (resumed)")
    parser.add_argument("--out", type=Path, help="folder for predictor_selection.md")
    args = parser.parse_args()
    rows = []
    for name, overrides in CANDIDATES.items():
        result = train_predictor(args.profile, args.bank, args.work / name, verbose=False,
                                 heldout_families=HELDOUT, **overrides)
        history = mlflow.MlflowClient(tracking_uri()).get_metric_history(result.run_id, "val_mae")
        last = max(history, key=lambda m: m.step)
        rows.append({"name": name, "epochs": overrides["max_epochs"], "mae": last.value,
                     "params": parameters(args.profile, overrides),
                     "best_epoch_mae": min(m.value for m in history)})
    best = min(r["mae"] for r in rows)
    choice = min((r for r in rows if r["mae"] <= best * (1 + TOLERANCE)), key=lambda r: (r["params"], r["epochs"]))
    lines = [f"Held-out families: {', '.join(HELDOUT)}. Capped MAE on their train + val curves.", "",
             "| candidate | parameters | epochs | held-out MAE, last epoch | best epoch | chosen |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['params']:,} | {r['epochs']} | {r['mae']:.2f} | {r['best_epoch_mae']:.2f} | "
              f"{'yes' if r is choice else ''} |" for r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "predictor_selection.md").write_text(text)


if __name__ == "__main__":
    main()
