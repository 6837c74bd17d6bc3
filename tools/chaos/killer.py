"""The chaos run's killer: SIGKILL a host's processes at random and check they come back.

A host is one supervisor (`python -m runner`); its processes are found by
walking the supervisor's descendants and reading their command lines. A
kill of a program the supervisor itself runs (a celery worker's main
process, beat, the relay, gunicorn's master) must be followed by a new
process of that role within RESTART_DEADLINE seconds; gunicorn's master
replaces a killed web worker and celery's main process a killed pool child.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

# role -> weight of being picked for a kill.
TARGETS = {
    "web-worker": 5,
    "worker-child": 2,
    "worker-main": 2,
    "relay": 2,
    "beat": 1,
    "web-master": 0.3,
}
RESTART_DEADLINE = 75.0  # the supervisor's backoff may reach 30 s after repeated kills


def role_of(proc: psutil.Process, parent_role: str | None) -> str | None:
    """Tell what a supervisor's descendant is, from its command line."""
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    if "gunicorn" in cmd:
        return "web-worker" if parent_role == "web-master" else "web-master"
    if "relay_outbox" in cmd:
        return "relay"
    if "celery" in cmd and " beat" in cmd:
        return "beat"
    if "celery" in cmd and " worker" in cmd:
        return "worker-child" if parent_role == "worker-main" else "worker-main"
    return None


def processes(supervisor_pid: int) -> dict[str, list[int]]:
    """Return {role: [pid, ...]} of a supervisor's live descendants."""
    found: dict[str, list[int]] = {}

    def walk(proc: psutil.Process, parent_role: str | None) -> None:
        try:
            children = proc.children()
        except psutil.NoSuchProcess:
            return
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.NoSuchProcess:
                continue
            role = role_of(child, parent_role)
            if role is not None:
                found.setdefault(role, []).append(child.pid)
            walk(child, role)

    try:
        walk(psutil.Process(supervisor_pid), None)
    except psutil.NoSuchProcess:
        pass
    return found


@dataclass
class Killer:
    """Kill at random intervals until stopped; record every kill in the timeline."""

    supervisors: dict[str, int]  # host name -> supervisor pid
    timeline: Callable[[dict], None]
    rng: random.Random
    min_interval: float = 3.0
    max_interval: float = 9.0
    stop: threading.Event = field(default_factory=threading.Event)
    kills: list[dict] = field(default_factory=list)
    not_restarted: list[str] = field(default_factory=list)
    pending: list[tuple[float, str, str, set[int]]] = field(default_factory=list)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="killer", daemon=True)
        self.thread.start()

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def _loop(self) -> None:
        next_kill = time.monotonic() + self.rng.uniform(self.min_interval, self.max_interval)
        while not self.stop.wait(0.5):
            self.check_restarts()
            if time.monotonic() >= next_kill:
                self.kill_one()
                next_kill = time.monotonic() + self.rng.uniform(
                    self.min_interval, self.max_interval
                )

    def kill_one(self) -> dict | None:
        host = self.rng.choice(sorted(self.supervisors))
        found = processes(self.supervisors[host])
        roles = [r for r in TARGETS if found.get(r)]
        if not roles:
            return None
        role = self.rng.choices(roles, weights=[TARGETS[r] for r in roles])[0]
        pid = self.rng.choice(found[role])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        record = {"t": time.time(), "type": "kill", "host": host, "target": role, "pid": pid}
        self.kills.append(record)
        self.timeline(record)
        before = set(found.get(role, []))
        self.pending.append((time.monotonic() + RESTART_DEADLINE, host, role, before))
        return record

    def check_restarts(self, *, final: bool = False) -> None:
        """Record a kill whose role has no new process after its deadline as not restarted."""
        still = []
        for deadline, host, role, before in self.pending:
            now_pids = set(processes(self.supervisors[host]).get(role, []))
            if now_pids - before:
                continue
            if time.monotonic() < deadline and not final:
                still.append((deadline, host, role, before))
                continue
            message = f"host {host}: no new {role} within {RESTART_DEADLINE:.0f} s of a kill"
            self.not_restarted.append(message)
            self.timeline({"t": time.time(), "type": "not_restarted", "host": host, "target": role})
        self.pending = still

    def wait_restarts(self, timeout: float) -> None:
        """Wait until every kill is followed by a new process (or its deadline passed)."""
        deadline = time.monotonic() + timeout
        while self.pending and time.monotonic() < deadline:
            self.check_restarts()
            time.sleep(0.5)
        self.check_restarts(final=True)
