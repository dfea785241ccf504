"""What an evaluation's figures rest on, and when a stored figure still holds.

An evaluation writes `inputs.json` beside its `results.json`: the content
digests of the bank, of the predictors read from files and of each learned
policy's weights, the machine (docs/decisions.md, "CPU kernels"), and one key
per cell (method × task set × load) that names everything its record depends
on, the code included. The report lists the digests; a stage run again keeps
the records whose keys are unchanged (docs/design.md §8).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mara_common.config import ConfigError
from mara_common.kernels import machine
from mara_env.env import EnvConfig
from mara_fm.bank import bank_digest
from mara_fm.predictors import predictor_digest
from mara_rl.methods import Method
from mara_rl.policy import policy_digest
from mara_rl.run_state import run_inputs

INPUTS_JSON = "inputs.json"  # beside an evaluation's results.json
CODE_PACKAGES = ("mara_common", "mara_env", "mara_fm", "mara_rl")  # what `code_digest` reads


def evaluation_inputs(methods: list[Method], bank: Path) -> dict[str, Any]:
    """What an evaluation's figures rest on: the content digests of the bank, of the predictors
    read from files (FM's export, the history pool's bank; by kind) and of each learned
    policy's weights, and the machine they were computed on."""
    predictors: dict[str, set[str]] = {}
    for m in methods:
        kind, has_files, _ = m.predictor.partition(":")
        if has_files:
            predictors.setdefault(kind, set()).add(predictor_digest(m.predictor))
    return {"bank": bank_digest(bank), "machine": machine(),
            "predictors": {kind: sorted(digests) for kind, digests in predictors.items()},
            "policies": {m.label: policy_digest(m.policy) for m in methods if m.policy}}


def input_tags(inputs: dict[str, Any]) -> dict[str, str]:
    """MLflow tags of `evaluation_inputs` or `run_inputs` (bank, predictor digests) and the
    machine, so that runs made from other files or on another processor can be told apart."""
    found = {"bank": inputs.get("bank"), "predictor": inputs.get("predictor")}
    return {**{f"input.{k}": v for k, v in found.items() if isinstance(v, str)},
            **{f"machine.{k}": v for k, v in machine().items()}}


@functools.cache
def code_digest() -> str:
    """A hash of the source of the packages an evaluation runs: a changed rule, simulator or
    predictor makes every stored cell stale."""
    root = Path(__file__).resolve().parents[1]
    sha = hashlib.sha256()
    for path in sorted(p for pkg in CODE_PACKAGES for p in (root / pkg).rglob("*.py")):
        sha.update(path.relative_to(root).as_posix().encode())
        sha.update(path.read_bytes())
    return sha.hexdigest()[:16]


def method_inputs(method: Method, env_cfg: EnvConfig) -> dict[str, Any]:
    """What a method's outcomes on `env_cfg`'s episodes depend on, besides the episodes and
    the code: every env setting it runs with, and the content of its bank, its predictor and
    its policy (paths are left out: the same files elsewhere are the same inputs)."""
    method_cfg = method.env_config(env_cfg)
    env = {k: v for k, v in asdict(method_cfg).items() if k not in ("bank", "predictor")}
    return {**run_inputs(method_cfg), "policy": policy_digest(method.policy) if method.policy else None, "env": env}


def digest(what: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cell_key(method: Method, cfg: EnvConfig, scenario: str, episodes: list[Any]) -> str:
    """A digest of what an evaluation cell's record depends on: `method_inputs` on the cell's
    env (its task set and load included), the method's name and seed, the scenario, the
    episodes (split, roots, per root), and the code."""
    return digest({**method_inputs(method, cfg), "method": method.label, "scenario": scenario,
                   "episodes": episodes, "code": code_digest()})


def load_inputs(results: Sequence[str | Path]) -> dict[str, Any]:
    """The `inputs.json` beside each `results.json` (an evaluation's `evaluation_inputs`),
    merged: every distinct value of each input, so that two evaluations made from different
    files show both."""
    merged: dict[str, Any] = {"bank": set(), "machine": [], "predictors": {}, "policies": {}}
    for path in results:
        file = Path(path).with_name(INPUTS_JSON)
        if not file.exists():
            continue
        try:
            inputs = json.loads(file.read_text())
            merged["bank"].add(inputs["bank"])
            if inputs["machine"] not in merged["machine"]:
                merged["machine"].append(inputs["machine"])
            for group in ("predictors", "policies"):
                for key, value in inputs[group].items():
                    merged[group].setdefault(key, set()).update([value] if isinstance(value, str) else value)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ConfigError(f"{file}: not an inputs file of `mara evaluate` ({exc!r}); "
                              "evaluate again to rewrite it") from None
    if not merged["bank"]:
        return {}
    return {"bank": sorted(merged["bank"]), "machine": merged["machine"],
            **{g: {k: sorted(v) for k, v in merged[g].items()} for g in ("predictors", "policies")}}
