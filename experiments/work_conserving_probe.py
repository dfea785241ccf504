"""Probe: trained MAT policies with the work-conserving mask switched on at inference only.

A policy trained without `MATConfig.work_conserving` may leave nodes idle
beside waiting tasks, which on this simulator never helps (serving costs
nothing). This runs the given policies on the profile's frozen episodes
(main load, every task set, and the stress scenario) with idle masked while
a task is unserved, so the effect can be read before retraining with the
mask. The policies are otherwise unchanged.

    python experiments/work_conserving_probe.py --profile default \
        --policies mara=artifacts/scheduler/default-fm-beta0.1-seed0/policy --out reports/default/probe
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from mara_env.env import EnvConfig
from mara_fm.build_bank import default_bank_path
from mara_fm.profile import section_config
from mara_rl.cli import parse_policies
from mara_rl.evaluate import EvalConfig, Method, evaluate, learned, markdown_table
from mara_rl.train_scheduler import act, load_policy


def work_conserving(name: str, policy_dir: str) -> Method:
    def make():
        module = load_policy(policy_dir)
        module.cfg.work_conserving = True
        return lambda obs, envs: act(module, obs)

    return dataclasses.replace(learned(name, policy_dir), name=f"{name}+wc", make=make)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="default")
    parser.add_argument("--policies", required=True, help="NAME=POLICY_DIR,...")
    parser.add_argument("--load", type=float, default=0.04)
    parser.add_argument("--out", type=Path, help="folder for results.md / results.json")
    args = parser.parse_args()
    bank = default_bank_path(args.profile)
    env_cfg = section_config(EnvConfig, args.profile, "env", bank=str(bank))
    eval_cfg = section_config(EvalConfig, args.profile, "evaluation")
    methods = [work_conserving(name, path) for name, path in parse_policies(args.policies).items()]
    records = evaluate(methods, ["id", "rl_ood", "vit_ood"], [args.load], bank, env_cfg, eval_cfg,
                       log_mlflow=False)
    records += evaluate(methods, ["id"], [args.load], bank, env_cfg, eval_cfg, scenario="stress",
                        log_mlflow=False)
    table = markdown_table(records)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "work_conserving_probe.md").write_text(
            "# Trained policies with the work-conserving mask at inference\n\n" + table)


if __name__ == "__main__":
    main()
