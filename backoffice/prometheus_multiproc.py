"""The folder prometheus_client's multiprocess mode shares between a host's processes.

Every web and worker process started with `PROMETHEUS_MULTIPROC_DIR` writes
its counters and histograms to files there; `/metrics` sums them. The folder
must be emptied before the processes start (a stale file would add an old
run's counts): the run command does it with

    python -m backoffice.prometheus_multiproc <folder>

and gunicorn.conf.py makes a private temporary folder when the variable is
not set (then only gunicorn's workers share it) and marks each exited worker
dead. Imports neither Django nor prometheus_client at module level: gunicorn's
master loads it before any application.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare(folder: str | os.PathLike) -> Path:
    """Create `folder` if needed and remove every metrics file left in it."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    return path


def ensure_env() -> str | None:
    """Make a fresh private folder and set the variable when it is unset; return it if made.

    A folder already named is created if missing (and left as it is otherwise).
    """
    if os.environ.get(ENV):
        Path(os.environ[ENV]).mkdir(parents=True, exist_ok=True)
        return None
    folder = tempfile.mkdtemp(prefix="shop-prometheus-")
    os.environ[ENV] = folder
    return folder


def remove(folder: str | None) -> None:
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def process_dead(pid: int) -> None:
    """Tell prometheus_client that process `pid` exited (drops its live-gauge files)."""
    if os.environ.get(ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)


def main(argv: list[str]) -> int:
    folder = argv[1] if len(argv) > 1 else os.environ.get(ENV)
    if not folder:
        print(f"usage: python -m backoffice.prometheus_multiproc FOLDER (or set {ENV})")
        return 2
    prepare(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
