"""The CPU-kernel pin: what `MARA_KERNELS` asks for, and that it takes effect in the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mara_common.config import ConfigError
from mara_common.kernels import KERNELS_ENV, PINS, has_avx2, kernel_env


def test_the_pin_is_asked_for_keeps_user_values_and_names_a_bad_choice(monkeypatch) -> None:
    for name in PINS["avx2"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(KERNELS_ENV, raising=False)
    assert kernel_env() == {}  # native by default
    monkeypatch.setenv(KERNELS_ENV, "avx2")
    assert kernel_env() == (PINS["avx2"] if has_avx2() else {})
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert kernel_env().get("MKL_CBWR", "COMPATIBLE") == "COMPATIBLE"
    monkeypatch.setenv(KERNELS_ENV, "avx512")
    with pytest.raises(ConfigError, match=f"{KERNELS_ENV}='avx512'"):
        kernel_env()


def test_the_cli_pins_before_torch_runs_a_kernel() -> None:
    """Importing the whole CLI runs no torch kernel, so the pin `main` sets is the one torch reads
    (a pin to the generic kernels shows it on any processor)."""
    code = ("import os, mara_rl.cli, torch\n"
            "os.environ['ATEN_CPU_CAPABILITY'] = 'default'\n"
            "torch.ones(8).exp().sum()\n"
            "print(torch.backends.cpu.get_cpu_capability())")
    env_free = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_free, check=True)
    assert out.stdout.strip() == "DEFAULT"
