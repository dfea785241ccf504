"""The suite's exit status is pytest's own: conftest.py's guard against crashes in the
interpreter's teardown must not hide a failure, nor turn a pass into one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mara_common.paths import PROJECT_ROOT


@pytest.mark.parametrize(("check", "status", "summary"), [
    ("1 + 1 == 3", 1, "1 failed"),
    ("1 + 1 == 2", 0, "1 passed"),
])
def test_the_suite_leaves_with_pytests_status(tmp_path, check, status, summary):
    (tmp_path / "test_one.py").write_text(f"def test_one():\n    assert {check}\n")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", str(tmp_path)],
                         cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == status, run.stdout + run.stderr
    assert summary in run.stdout  # the report is out before the process leaves
