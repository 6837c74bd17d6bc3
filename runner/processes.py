"""Process plumbing shared by the embedded servers and the run command.

The guarantee: nothing we start outlives the process that started it. On
Linux every child asks the kernel for a signal when its parent dies
(`PR_SET_PDEATHSIG`), so even a SIGKILL of the supervisor or of pytest stops
the children; every start also looks for what a dead predecessor left (pid
files, sockets, processes) and clears it first.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

_PR_SET_PDEATHSIG = 1

# Unix socket paths are limited to about 107 bytes, so sockets and pid files
# live under a short folder in /tmp named after the data folder they serve.
SHORT_TMP = Path("/tmp") if Path("/tmp").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))


class ServerBusy(RuntimeError):
    """Another live process runs this embedded server (its lock is held)."""


def hold_lock(path: Path, *, what: str) -> int:
    """Take an exclusive lock on `path` for this process's life; return its descriptor.

    The kernel releases it when the holder dies, however it dies, so a later
    start can tell a leftover from a live owner. Raise ServerBusy if held.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServerBusy(f"another process is running {what}") from None
    return fd


def run_dir_for(data_root: Path) -> Path:
    """Return the short runtime folder (sockets, pid and lock files) for a data folder."""
    digest = hashlib.sha256(str(Path(data_root).resolve()).encode()).hexdigest()[:12]
    return SHORT_TMP / f"shop-{digest}"


def ensure_owned_dir(path: Path, *, mode: int = 0o755) -> Path:
    """Create `path` (one level) owned by us; refuse a folder or link planted by someone else."""
    try:
        path.mkdir(mode=mode)
    except FileExistsError:
        pass
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RuntimeError(f"{path} exists but is not a folder owned by this user")
    if stat.S_IMODE(info.st_mode) != mode:
        path.chmod(mode)
    return path


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """Return a `preexec_fn` that makes the child receive `sig` when this process dies.

    Runs after the child switched user (Popen's `user=`), because changing
    credentials clears the setting. Elsewhere than Linux it returns None and
    the next start's recovery cleans up instead; `SHOP_NO_PDEATHSIG=1` does
    the same on Linux, so that tests can exercise that recovery.
    """
    if not sys.platform.startswith("linux") or os.environ.get("SHOP_NO_PDEATHSIG") == "1":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def process_matches(pid: int, *, create_time: float | None = None, cwd: Path | None = None) -> bool:
    """Tell whether `pid` is still the process we mean, not a reused pid.

    Servers are recognised by their working folder: PostgreSQL and Redis both
    work in their data folder, and both rewrite their command line.
    """
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            return False
        if cwd is not None and proc.cwd() != str(cwd):
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until the processes are gone; return those still alive at the deadline.

    A zombie counts as gone: it has exited, and a process that is not our
    child stays a zombie until its own parent reaps it.
    """
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    _reap(pid)
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_pid(pid: int, *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Send `sig`, wait up to `timeout`, then SIGKILL what is left."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    if wait_gone([pid], timeout):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        wait_gone([pid], 5.0)


def group_alive(pgid: int) -> bool:
    """Tell whether a process group still has a live (non-zombie) member."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # kill() reaches zombies too; a zombie whose parent is gone may never be
    # reaped where pid 1 does not reap, so look at the members themselves.
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and _alive(pid):
                return True
        except (ProcessLookupError, PermissionError):
            continue
    return False


def stop_group(pgid: int, *, sig: int = signal.SIGTERM, timeout: float = 20.0) -> None:
    """Signal a whole process group (a child and its workers); SIGKILL it after `timeout`."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def stop_child_group(proc: subprocess.Popen, *, sig: int, timeout: float) -> None:
    """Stop a child that leads its own process group, then reap it (SIGKILL if it lingers)."""
    stop_group(proc.pid, sig=sig, timeout=timeout)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_leader_then_group(pgid: int, *, timeout: float = 20.0) -> None:
    """Ask a group's leader to stop (it stops its own workers gracefully), then clear the group.

    Signalling the whole group at once would hit the workers directly and cut
    short the graceful shutdown of e.g. a Celery worker's running tasks.
    """
    try:
        os.kill(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    else:
        wait_gone([pgid], timeout)
    stop_group(pgid, sig=signal.SIGTERM, timeout=5.0)


def _reap(pid: int) -> None:
    # A group leader that is our own child stays a zombie (and keeps the
    # group "alive") until waited for.
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free right now on `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = 30) -> str:
    """Return the last lines of a log file, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
