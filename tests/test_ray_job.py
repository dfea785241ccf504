"""Scheduler training and a live run submitted as real Ray jobs, logging to a real MLflow server.

Starts its own Ray head (token auth, its own ports and temp dir) and MLflow
server on loopback, and stops exactly those process groups afterwards, so
other Ray clusters on the machine are left alone.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from mara_live.report import LIVE_EXPERIMENT
from mara_rl.cli import main
from mara_rl.train_scheduler import EXPERIMENT

pytestmark = pytest.mark.integration
VENV_BIN = Path(sys.executable).parent


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_for(url: str, timeout_s: float) -> None:
    """Until the server answers at all (an auth error counts: it is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"{url} did not come up in {timeout_s:.0f} s")


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM the leader (lets `ray start --block` shut its children down), then kill the group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Ray head and an MLflow server, shared by the module's jobs."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from _services(tmp_path_factory.mktemp("services"), monkeypatch)


def _services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    token = secrets.token_hex(16)
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env.pop("RAY_ADDRESS", None)
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)

    gcs, dash, client, agent, agent_grpc, rt_agent, metrics, nm, om, ml = free_ports(10)
    ray_tmp = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: socket paths are length-limited
    head = subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={gcs}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
         f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--runtime-env-agent-port={rt_agent}", f"--metrics-export-port={metrics}",
         f"--node-manager-port={nm}", f"--object-manager-port={om}", "--num-cpus=2",
         "--disable-usage-stats", f"--temp-dir={ray_tmp}"],
        env=env, stdout=open(tmp_path / "ray.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    mlflow_server = subprocess.Popen(
        [str(VENV_BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(ml), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
         "--artifacts-destination", str(tmp_path / "mlartifacts")],
        env=env, stdout=open(tmp_path / "mlflow.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        wait_for(f"http://127.0.0.1:{dash}/api/version", 90)
        wait_for(f"http://127.0.0.1:{ml}/health", 90)
        yield {"ray": f"http://127.0.0.1:{dash}", "mlflow": f"http://127.0.0.1:{ml}"}
    finally:
        stop_group(head, grace_s=30)
        stop_group(mlflow_server, grace_s=10)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_training_job_succeeds_and_logs_to_mlflow(services: dict[str, str], smoke_bank: Path,
                                                  tmp_path: Path) -> None:
    import mlflow

    out = tmp_path / "run"
    # `mara submit-scheduler`, as a user runs it: checks, creates the experiment, submits, waits.
    main(["submit-scheduler", "--profile", "smoke", "--bank", str(smoke_bank), "--out", str(out),
          "--num-env-runners", "0", "--run-name", "ray-job-test", "--predictor", "wls",
          "--address", services["ray"], "--mlflow-uri", services["mlflow"], "--wait", "--timeout", "150"])
    assert (out / "policy" / "policy.pt").exists()

    client = mlflow.MlflowClient(services["mlflow"])
    (experiment,) = [e for e in client.search_experiments() if e.name == EXPERIMENT]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on its runs
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "ray-job-test" and run.info.status == "FINISHED"
    for key in ("policy_loss", "vf_loss", "entropy", "env_steps_per_s"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2], key
    # The profile's warm start ran in the job: its policy was validated before PPO (step 0).
    assert "imitation_node_agreement" in run.data.metrics
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_success_rate")] == [0, 1, 2]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "policy")} == {
        "policy/policy.pt", "policy/policy.json"}


def test_live_run_job_trains_on_the_clusters_node_actors(services: dict[str, str], smoke_bank: Path,
                                                          tmp_path: Path) -> None:
    import mlflow

    out = tmp_path / "live"
    main(["submit-live", "--profile", "smoke", "--bank", str(smoke_bank), "--method", "edf", "--horizon", "60",
          "--kill-at", "20", "--out", str(out), "--address", services["ray"], "--mlflow-uri", services["mlflow"],
          "--wait", "--timeout", "300"])
    result = json.loads((out / "result.json").read_text())
    assert result["stats"]["faults"] == 1 and result["stats"]["batches"] > 0
    client = mlflow.MlflowClient(services["mlflow"])
    (experiment,) = [e for e in client.search_experiments() if e.name == LIVE_EXPERIMENT]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.data.metrics["success_rate"] == result["success_rate"]
    assert run.data.metrics["matching_decisions"] == run.data.metrics["decisions"] == 60
