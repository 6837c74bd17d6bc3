"""Fixtures for the run command and the embedded servers: short folders, leftover checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from runner.processes import SHORT_TMP, free_port, run_dir_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def short_tmp():
    """A folder with a short path that the `pgserver` system user can traverse (as root)."""
    path = Path(tempfile.mkdtemp(prefix="shop-t", dir=SHORT_TMP))
    path.chmod(0o755)
    yield path
    _kill(_matching(under=path))  # servers a failed test left running
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(run_dir_for(path / "var"), ignore_errors=True)
    shutil.rmtree(run_dir_for(path / "var" / "test"), ignore_errors=True)


@pytest.fixture
def marker():
    """A value put in the environment of what a test starts, to find its processes later."""
    value = uuid.uuid4().hex
    yield value
    _kill(_matching(marker=value))  # what a failed test left running


def embedded_env(*, marker: str, var: Path, **extra: str) -> dict[str, str]:
    """The environment of a fresh machine: no DATABASE_URL / REDIS_URL, our own var folder,
    and nothing of this session's xdist worker (an inner pytest is no worker)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL", "SHOP_TEST_SERIAL_ONLY")
        and not k.startswith("PYTEST_XDIST_")
    }
    env.update(SHOP_VAR_DIR=str(var), SHOP_TEST_MARKER=marker, PYTHONUNBUFFERED="1")
    env["SIMULATOR_PORT"] = str(free_port())
    env.update(extra)
    return env


def leftovers(*, marker: str | None = None, under: Path | None = None) -> list[str]:
    """Describe live processes carrying `marker` in their environment or working under `under`.

    PostgreSQL rewrites its environment area for its process titles, so its
    processes are found by their working folder (the data folder) instead.
    """
    found = []
    for proc in _matching(marker, under):
        try:
            found.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def _matching(marker: str | None = None, under: Path | None = None) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            ours = marker is not None and proc.environ().get("SHOP_TEST_MARKER") == marker
            if not ours and under is not None:
                cwd = proc.cwd()
                ours = cwd == str(under) or cwd.startswith(f"{under}/")
            if ours:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def sockets_under(path: Path) -> list[Path]:
    if not path.exists():
        return []
    return [p for p in path.rglob("*") if p.is_socket()]


def wait_for(condition, *, timeout: float, message: str):
    """Poll `condition` until it returns something truthy; fail with `message` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{message} (after {timeout} s)")
        time.sleep(0.1)


def start_and_lose(code: str) -> subprocess.Popen:
    """Run `code` (which starts a server as `server`) in a child Python that stays alive.

    The child then drops the server's lock, as a starter that lost track of
    its server would: the server keeps running with a live parent (so no
    parent-death signal stops it), the state a later start must recover from.
    """
    script = f"{code}\nserver._unlock()\nprint('ready', flush=True)\nimport time\ntime.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    assert line.strip() == b"ready", line
    return proc


START_TIMEOUT = 240  # a first start migrates a fresh database on a busy machine


def start_run(env: dict, log) -> subprocess.Popen:
    """Start the run command (`python -m runner`, what `make run` calls) with output to `log`."""
    return subprocess.Popen(
        [sys.executable, "-m", "runner"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_up(base: str, proc: subprocess.Popen, log_path: Path) -> None:
    """Wait until this run announced itself and serves /healthz and the demo catalog."""

    def ready():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        # This run's announcement, not an answer from a leftover of an earlier one.
        if "run: the shop is running at" not in log_path.read_text():
            return False
        try:
            health = requests.get(f"{base}/healthz", timeout=2)
            catalog = requests.get(f"{base}/api/v1/products/", timeout=2)
        except requests.RequestException:
            return False
        if health.status_code != 200 or catalog.status_code != 200:
            return False
        return "TEE-M" in {item["sku"] for item in catalog.json()["results"]}

    wait_for(ready, timeout=START_TIMEOUT, message=f"the shop never came up at {base}")
