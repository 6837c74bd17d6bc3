"""Smoke test of the README's first command on the embedded services.

Starts `make run` in the background with no DATABASE_URL / REDIS_URL, waits
for /healthz 200 and the demo catalog, sends SIGTERM, and fails if any
process, socket or listening port is left behind. Run by .ci/run with the
project's virtualenv Python.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runner import var_dir  # noqa: E402
from runner.processes import free_port, port_is_free, run_dir_for  # noqa: E402

TIMEOUT = 300


def leftovers(marker: str, var: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cwd = proc.cwd()
            if proc.environ().get("SHOP_SMOKE_MARKER") == marker or cwd.startswith(f"{var}/"):
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def main() -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    port = free_port()
    marker = uuid.uuid4().hex
    env.update(PORT=str(port), SIMULATOR_PORT=str(free_port()), SHOP_SMOKE_MARKER=marker)
    var = var_dir()
    run_dir = run_dir_for(var)
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    log = tempfile.TemporaryFile()
    make = subprocess.Popen(
        ["make", "run"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    failures: list[str] = []
    try:
        deadline = started + TIMEOUT
        while True:
            if make.poll() is not None:
                failures.append(f"make run exited early with code {make.returncode}")
                break
            try:
                health = requests.get(f"{base}/healthz", timeout=2).status_code
                catalog = requests.get(f"{base}/api/v1/products/", timeout=2)
                skus = {item["sku"] for item in catalog.json()["results"]}
            except (requests.RequestException, ValueError, KeyError):
                health, skus = None, set()
            if health == 200 and "TEE-M" in skus:
                took = time.monotonic() - started
                print(f"smoke: /healthz 200 and the demo catalog after {took:.1f} s", flush=True)
                break
            if time.monotonic() > deadline:
                failures.append(f"no /healthz 200 with the demo catalog within {TIMEOUT} s")
                break
            time.sleep(0.5)
    finally:
        if make.poll() is None:
            make.send_signal(signal.SIGTERM)
            try:
                code = make.wait(timeout=120)
            except subprocess.TimeoutExpired:
                failures.append("make run did not stop within 120 s of SIGTERM")
                make.kill()
                code = make.wait()
            # make passes SIGTERM on to the run command, waits for it, then
            # ends itself by the same signal.
            if code not in (0, -signal.SIGTERM):
                failures.append(f"make run exited with code {code} after SIGTERM")
    log.seek(0)
    output = log.read().decode(errors="replace")
    print(output)
    if "run: stopped\n" not in output:
        failures.append("the run command did not report a clean stop")
    left = leftovers(marker, var)
    if left:
        failures.append("processes left behind:\n  " + "\n  ".join(left))
    sockets = [str(p) for p in run_dir.rglob("*") if p.is_socket()] if run_dir.exists() else []
    if sockets:
        failures.append(f"sockets left behind: {sockets}")
    if not port_is_free(port):
        failures.append(f"port {port} still taken")
    for failure in failures:
        print(f"smoke: FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("smoke: stopped cleanly, nothing left behind")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
