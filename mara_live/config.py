"""Settings of live mode: profile section `[live]`."""

from __future__ import annotations

from dataclasses import dataclass

from mara_common.config import check_config, setting


@dataclass(frozen=True)
class LiveConfig:
    """Profile section `[live]`."""

    streams: int = setting(3, ge=1, help="generated streams a comparison runs")
    stream_seed: int = setting(1000, ge=0, help="seed of the first generated stream (then +1, +2, ...)")
    task_set: str = setting("id", help="the bank's task set generated streams draw from")
    split: str = setting("test", choices=("train", "val", "test"), help="the bank's split generated streams draw from")
    horizon: int = setting(1000, ge=1, help="ticks of a generated stream")
    arrival_prob: float = setting(0.04, gt=0.0, le=1.0, help="arrival probability per tick of a generated stream")
    methods: tuple[str, ...] = setting(("mara", "lara_fm_optimistic", "lara", "edf"),
                                       help="methods a comparison runs live")
    checkpoint_every: int = setting(25, ge=1, help="batches between periodic checkpoints of a job a node holds")
    cpus_per_node: float = setting(0.25, gt=0.0, help="CPUs Ray reserves for each node actor")
    gpus_per_node: float = setting(0.0, ge=0.0, help="GPUs Ray reserves for each node actor (0: CPU nodes)")
    threads_per_node: int = setting(1, ge=1, help="torch threads of each node actor")
    paused_per_node: int = setting(4, ge=0, help="paused jobs a node keeps in memory (resumed there: no restore)")
    kill_at: int = setting(-1, ge=-1, help="tick at which one node actor is killed on purpose (-1: never)")
    kill_node: int = setting(0, ge=0, help="the node killed at kill_at")
    show_every: int = setting(100, ge=0, help="ticks between per-node progress tables (0: none)")
    family_draws: int = setting(8, ge=1, help="replays of a stream on other runs of each job's family "
                                              "(the simulator's expectation for fresh runs)")

    def __post_init__(self) -> None:
        check_config(self)
