"""Which CPU kernels torch and MKL run: the libraries' own choice, or pinned to their AVX2
versions, the branch the libraries promise to keep the same on every processor that runs it.

Why: within one machine every run is bit-identical, but torch's vectorised kernels and MKL's
matrix products pick their code by the processor (AVX2 here, AVX-512 elsewhere), their sums
differ in the last bits, and PPO amplifies that into another policy (docs/decisions.md, "CPU
kernels: a pin to AVX2 on request"). The pin is the environment variables the libraries read
when they first run: torch's `ATEN_CPU_CAPABILITY`, MKL's conditional-numerical-reproducibility
branch `MKL_CBWR` and oneDNN's `ONEDNN_MAX_CPU_ISA`.

`MARA_KERNELS` chooses: `native` (the default: the libraries' own choice, which every recorded
figure was computed with) or `avx2` (left unpinned on a processor without AVX2). The pin does not
make results identical across processors: an Intel Xeon and an AMD EPYC build different banks
with it as without it, and it changes the last bits of the bank, and so the predictor and every
trained policy, on each of them; so it is not the default. A variable the user has set already
is kept. The CLI pins before any work and the Ray workers it starts inherit the pin; a Ray job
gets it in its runtime env.
"""

from __future__ import annotations

import os
import platform
from functools import cache
from pathlib import Path

from mara_common.config import ConfigError

KERNELS_ENV = "MARA_KERNELS"
PINS = {"avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        "native": {}}


@cache
def cpu_info() -> dict[str, str]:
    """The first processor's fields in Linux's /proc/cpuinfo (empty elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def has_avx2() -> bool:
    """The processor runs AVX2 (read from /proc/cpuinfo; elsewhere assumed not)."""
    return platform.machine().lower() in ("x86_64", "amd64") and "avx2" in cpu_info().get("flags", "").split()


def machine() -> dict[str, str]:
    """What a figure was computed on, for the record: the processor, its widest vector
    instructions (what the libraries' kernels choose by), the kernel choice, and the versions
    of the numeric libraries. Figures reproduce bit for bit where all of these agree."""
    import numpy
    import torch

    flags = cpu_info().get("flags", "").split()
    vector = next((isa for isa in ("avx512f", "avx2") if isa in flags), platform.machine())
    return {"processor": cpu_info().get("model name", platform.processor() or "unknown"),
            "vector": vector.removesuffix("f"), "kernels": os.environ.get(KERNELS_ENV, "native"),
            "torch": torch.__version__, "numpy": numpy.__version__}


def kernel_env() -> dict[str, str]:
    """The variables `MARA_KERNELS` asks for on this processor (values the user set kept)."""
    choice = os.environ.get(KERNELS_ENV, "native")
    if choice not in PINS:
        raise ConfigError(f"{KERNELS_ENV}={choice!r}: expected one of {sorted(PINS)}")
    pins = PINS[choice] if choice != "avx2" or has_avx2() else {}
    return {k: os.environ.get(k, v) for k, v in pins.items()}


def pin_kernels() -> dict[str, str]:
    """Pin this process (and the processes it starts) before its first torch or MKL operation;
    later calls change nothing the libraries have already read. Returns the pin."""
    pins = kernel_env()
    os.environ.update(pins)
    return pins
