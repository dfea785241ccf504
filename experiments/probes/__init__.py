"""Probes: each script answers one research question on validation data and writes its
table to `results/<probe>.md` beside it (`--out` elsewhere). Run them from the project
root as modules, e.g. `python -m experiments.probes.planning_probe`."""
