"""A scheduler run folder: its checkpoint, its progress, and what may resume it.

Layout of a run folder:
- `checkpoint/`: RLlib's checkpoint of the last finished iteration, with
  `state.json` (iteration, env steps, MLflow run id, the settings, the best
  validation so far) *inside* it, so that one rename commits both;
- `best_policy-<iteration>/`: the best validated policy so far;
- `warm_start_policy/`: the imitated policy (PPO's anchor);
- `policy/`: the exported policy, written when training ends.

A crash at any point leaves either the previous checkpoint or the new one
(`commit_checkpoint`), never a state without its weights.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mara_common.config import ConfigError
from mara_env.env import EnvConfig
from mara_fm.bank import bank_digest
from mara_fm.predictors import predictor_digest
from mara_rl.scheduler_config import SchedulerConfig, resumable_settings

STATE_FILE = "state.json"
START_OVER = "start over with `mara train-scheduler --fresh`, or move the folder aside"


def checkpoint_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoint"


def warm_start_dir(out_dir: Path) -> Path:
    """Where a warm-started run keeps its imitated policy (PPO's anchor, mara_rl.anchored_ppo)."""
    return out_dir / "warm_start_policy"


def policy_dir(out_dir: Path) -> Path:
    """Where a training run in `out_dir` exports its policy (`load_policy` reads it)."""
    return out_dir / "policy"


def best_policy_dir(out_dir: Path, iteration: int) -> Path:
    """The policy validated at `iteration`, kept while it is the best so far. Named by
    iteration, so the folder the state records is always the policy it scored."""
    return out_dir / f"best_policy-{iteration}"


def load_state(out_dir: Path) -> dict[str, Any]:
    """A run folder's committed progress and settings ({} before its first checkpoint).

    Recovers the one state a crash inside `commit_checkpoint` can leave (the
    new checkpoint not yet in place, the previous one set aside), and refuses
    a folder whose checkpoint lacks its state.
    """
    final, old = checkpoint_dir(out_dir), out_dir / "checkpoint.old"
    if not final.exists() and old.exists():
        old.rename(final)
    if not final.exists():
        if (out_dir / STATE_FILE).exists():
            raise ConfigError(f"{out_dir}: holds {STATE_FILE} from an older layout without a "
                              f"checkpoint; {START_OVER}")
        return {}
    state_file = final / STATE_FILE
    if not state_file.exists():
        raise ConfigError(f"{final}: checkpoint without {STATE_FILE} (not written by this version); {START_OVER}")
    try:
        state = json.loads(state_file.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{state_file}: not valid JSON ({exc}); {START_OVER}") from None
    missing = [k for k in ("iteration", "config", "inputs") if k not in state]
    if missing:
        raise ConfigError(f"{state_file}: missing {missing} (not written by this version); {START_OVER}")
    return state


def is_run_folder(out_dir: Path) -> bool:
    """Whether `out_dir` holds nothing, or only what a scheduler run writes (what `--fresh`
    may delete)."""
    own = {"checkpoint", "checkpoint.tmp", "checkpoint.old", "policy", "warm_start_policy", STATE_FILE}
    return all(p.name in own or p.name.startswith("best_policy-") for p in out_dir.iterdir())


def commit_checkpoint(algo: Any, out_dir: Path, state: dict[str, Any]) -> Path:
    """Save the algorithm and `state` together: written beside the old checkpoint, then
    swapped in by renames, so a crash never leaves state without matching weights."""
    final, tmp, old = checkpoint_dir(out_dir), out_dir / "checkpoint.tmp", out_dir / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    algo.save_to_path(str(tmp.resolve()))
    (tmp / STATE_FILE).write_text(json.dumps(state, indent=1))
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _flat(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys (`scheduler.mat.embed_dim`), so that each compares alone."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat |= _flat(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Where the inputs live is not what they are: their content is compared by digest instead, so a
# run stays valid when the checkout moves.
LOCATIONS = ("scheduler.fm_path", "env.bank", "env.predictor")


def comparable(cfg: SchedulerConfig, env_cfg: EnvConfig) -> dict[str, Any]:
    """What must match for a resume to continue the same experiment, as dotted keys."""
    resumable = {f"scheduler.{name}" for name in resumable_settings()}
    values = json.loads(json.dumps({"scheduler": asdict(cfg), "env": asdict(env_cfg)}, default=str))
    return {k: v for k, v in _flat(values).items() if k not in resumable and k not in LOCATIONS}


def run_inputs(env_cfg: EnvConfig) -> dict[str, str]:
    """The content digests of what a run reads: its bank and its predictor's files."""
    return {"bank": bank_digest(env_cfg.bank_path), "predictor": predictor_digest(str(env_cfg.predictor))}


def settings_changed(state: dict[str, Any], cfg: SchedulerConfig, env_cfg: EnvConfig,
                     inputs: dict[str, str]) -> list[str]:
    """What differs between a stored run (`load_state`) and `cfg`/`env_cfg`, the content of
    its bank and predictor (`inputs`, from `run_inputs`) included: a resume or reuse must
    find nothing here."""
    if not state:
        return []
    # A setting added to the code after the run was stored counts as unchanged while it
    # holds its default (what the run had in effect).
    defaults = comparable(SchedulerConfig(), EnvConfig())
    changed = [key for key, value in comparable(cfg, env_cfg).items()
               if state["config"].get(key, defaults.get(key)) != value]
    changed += [f"the content of its {name} ({env_cfg.bank_path if name == 'bank' else env_cfg.predictor})"
                for name, digest in inputs.items() if state["inputs"].get(name) != digest]
    return changed
