"""Submit a `mara` command (scheduler training, a live run) to a Ray cluster as a job.

The project folder is uploaded as the job's working dir (without data, the
venv, the MLflow store or run outputs), the tracking URI travels in the
job's environment so its MLflow run lands in the same store, and the job
runs `python -m mara_rl.cli <command> <flags>` with the
Python found on the PATH of whoever ran `ray start`: start the head from the
project venv.

Ray 2.60 clusters use token authentication by default. The token is read
like Ray itself does ($RAY_AUTH_TOKEN, else the file at $RAY_AUTH_TOKEN_PATH,
else ~/.ray/auth_token) and sent as a bearer header; RAY_AUTH_MODE=disabled
skips it.
"""

from __future__ import annotations

import os
import shlex
import time
import urllib.error
import urllib.request
from pathlib import Path

from ray.job_submission import JobSubmissionClient

from mara_common.config import ConfigError
from mara_common.kernels import kernel_env
from mara_common.paths import PROJECT_ROOT
from mara_common.tracking import REACH_TIMEOUT_S, check_reachable, tracking_uri

UPLOAD_EXCLUDES = [
    ".git", "/.venv", "/data", "/artifacts", "/reports", "/mlruns", "/mlflow.db", "*.egg-info",
    "__pycache__", ".pytest_cache", ".ruff_cache", "lightning_logs", "/mlartifacts", "/.ray",
]
AGENT_WAIT_S = 90.0  # how long a freshly started head may take to accept jobs
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def auth_headers() -> dict[str, str]:
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return {}
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
        token = path.read_text().strip() if path.exists() else ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_cluster(address: str | None = None, timeout_s: float = REACH_TIMEOUT_S) -> str:
    """The dashboard address to submit to, checked: set, answering, and accepting our token."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConfigError("no Ray cluster given: set RAY_ADDRESS (or --address) to its dashboard, e.g. "
                          "http://127.0.0.1:8266 after `make ray-up` (README, 'Running on a cluster')")
    if not address.startswith(("http://", "https://")):
        raise ConfigError(f"Ray address {address!r}: give the dashboard's http://HOST:PORT")
    request = urllib.request.Request(f"{address.rstrip('/')}/api/version", headers=auth_headers())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return address
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise ConfigError(f"the Ray cluster at {address} refused the request ({exc.code}): it uses token "
                              "auth; set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to its token and "
                              "RAY_AUTH_MODE=token") from None
        return address  # it answered
    except OSError as exc:
        raise ConfigError(f"the Ray dashboard at {address} did not answer within {timeout_s:g} s ({exc}); "
                          "is the head running (`make ray-up`)?") from None


def submit_command(command: str, argv: list[str], address: str | None = None, wait: bool = False,
                   timeout_s: float = 24 * 3600.0, poll_s: float = 5.0,
                   mlflow_uri: str | None = None, echo_logs: bool = True) -> tuple[str, str]:
    """Submit `mara <command> <argv>` (its paths absolute: the job runs from a copy of the
    project); with `wait`, poll until the job ends (or `timeout_s`). Returns (job id, status)."""

    address = check_cluster(address)
    check_reachable(mlflow_uri or tracking_uri())
    client = JobSubmissionClient(address, headers=auth_headers())
    entrypoint = f"python -m mara_rl.cli {command} " + shlex.join(argv)
    job = {"entrypoint": entrypoint,
           "runtime_env": {"working_dir": str(PROJECT_ROOT), "excludes": UPLOAD_EXCLUDES,
                           "env_vars": {"MLFLOW_TRACKING_URI": mlflow_uri or tracking_uri(),
                                        "PYTHONUNBUFFERED": "1", **kernel_env()}},
           "metadata": {"project": "mara", "stage": command, "argv": shlex.join(argv)}}
    # A head that has just started answers before its job agent is up: wait for the agent.
    ready_by = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            job_id = client.submit_job(**job)
            break
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > ready_by:
                raise
            time.sleep(poll_s)
    if not wait:
        return job_id, str(client.get_job_status(job_id).value)
    deadline, shown = time.monotonic() + timeout_s, 0
    while True:
        status = str(client.get_job_status(job_id).value)
        if echo_logs:
            logs = client.get_job_logs(job_id)
            print(logs[shown:], end="", flush=True)
            shown = len(logs)
        if status in TERMINAL or time.monotonic() > deadline:
            return job_id, status
        time.sleep(poll_s)
