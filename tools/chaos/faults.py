"""The chaos run's dependency faults and the /healthz sampler (docs/failure-model.md).

Each host reaches PostgreSQL and the broker through a FaultProxy of its own
(tools/chaos/faultproxy.py), so one host can be partitioned while the other
still works. The schedule (fractions of the run) is fixed so that the CI short
form makes every kind at least once:

- `db_partition`: one host's database link blackholed (drop) for 5-30 s, healed;
- `broker_partition`: one host's broker link blackholed for 5-30 s, healed;
- `db_reset`: every connection of one host to the database reset at once,
  and new ones refused for a few seconds (a database crash as the host sees
  it: its sessions gone, its uncommitted transactions rolled back);
- `redis_hang`: the run's own redis-server SIGSTOPped for 5-10 s (the cache on
  both brokers, and the broker itself on Redis), then SIGCONT;
- `memory_alarm` (RabbitMQ only): the shared broker's watermark set very low
  for 3 s and ALWAYS restored (other users of that broker are blocked meanwhile).

The sampler asks every host's /healthz every 0.5 s; `judge` checks that each
fault was answered 503 within 2 s of its start and 200 within 10 s of its heal.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

from .faultproxy import FaultProxy

SAMPLE_EVERY = 0.5
DOWN_WITHIN = 2.0
UP_WITHIN = 10.0


@dataclass
class Fault:
    kind: str
    host: str  # a host name, or "*" for a shared dependency
    start: float = 0.0
    end: float = 0.0
    seconds: float = 0.0


@dataclass
class Faults:
    proxies: dict[tuple[str, str], FaultProxy]  # (host, "db" | "broker") -> proxy
    hosts: dict[str, str]  # host name -> base URL
    timeline: Callable[[dict], None]
    rng: random.Random
    redis_pid: Callable[[], int | None]
    rabbitmq: bool = False
    made: list[Fault] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def schedule(self, duration: float) -> list[tuple[float, Callable[[], None]]]:
        names = sorted(self.hosts)
        last = names[-1]
        short = max(5.0, min(30.0, duration / 12))
        plan = [
            (0.15, lambda: self.partition("db", names[0], self.rng.uniform(5, short))),
            (0.3, lambda: self.partition("broker", last, self.rng.uniform(5, short))),
            (0.5, lambda: self.db_reset(names[0], 3.0)),
            (0.7, lambda: self.redis_hang(self.rng.uniform(5, 10))),
        ]
        if self.rabbitmq:
            plan.append((0.8, lambda: self.memory_alarm(3.0)))
        if duration >= 600:  # the long form repeats every kind
            plan += [(f + 0.02, fn) for f, fn in plan[:4]]
        return sorted(((f * duration, fn) for f, fn in plan), key=lambda item: item[0])

    # -- faults (each blocks the calling thread for its length; run from a thread) ---

    def _record(self, fault: Fault) -> None:
        self.made.append(fault)
        self.timeline({"t": fault.start, "type": "fault", "kind": fault.kind,
                       "host": fault.host, "end": fault.end})  # fmt: skip

    def _in_thread(self, body: Callable[[], None]) -> None:
        threading.Thread(target=body, daemon=True).start()

    def partition(self, link: str, host: str, seconds: float) -> None:
        def body() -> None:
            proxy = self.proxies[(host, link)]
            fault = Fault(f"{link}_partition", host, time.time(), seconds=seconds)
            proxy.drop()
            try:
                time.sleep(seconds)
            finally:
                proxy.heal()
                fault.end = time.time()
                self._record(fault)

        self._in_thread(body)

    def db_reset(self, host: str, seconds: float) -> None:
        def body() -> None:
            proxy = self.proxies[(host, "db")]
            fault = Fault("db_reset", host, time.time(), seconds=seconds)
            proxy.reset()
            try:
                time.sleep(seconds)
            finally:
                proxy.heal()
                fault.end = time.time()
                self._record(fault)

        self._in_thread(body)

    def redis_hang(self, seconds: float) -> None:
        def body() -> None:
            pid = self.redis_pid()
            if pid is None:
                return
            fault = Fault("redis_hang", "*", time.time(), seconds=seconds)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
                fault.end = time.time()
                self._record(fault)

        self._in_thread(body)

    def memory_alarm(self, seconds: float) -> None:
        def body() -> None:
            fault = Fault("memory_alarm", "*", time.time(), seconds=seconds)
            try:
                subprocess.run(["rabbitmqctl", "-q", "set_vm_memory_high_watermark", "0.0001"],
                               capture_output=True, timeout=30)  # fmt: skip
                time.sleep(seconds)
            finally:
                subprocess.run(["rabbitmqctl", "-q", "set_vm_memory_high_watermark", "0.4"],
                               capture_output=True, timeout=30)  # fmt: skip
                fault.end = time.time()
                self._record(fault)

        self._in_thread(body)

    # -- /healthz sampling -------------------------------------------------------------

    def sample(self) -> None:
        """Until stop(): every host's /healthz every SAMPLE_EVERY s (a thread per host)."""

        def per_host(name: str, url: str) -> None:
            while not self._stop.wait(SAMPLE_EVERY):
                started = time.time()
                try:
                    status: int | None = requests.get(f"{url}/healthz", timeout=5).status_code
                except requests.RequestException:
                    status = None
                self.samples.append({"host": name, "t": started, "status": status,
                                     "took": time.time() - started})  # fmt: skip

        for name, url in self.hosts.items():
            threading.Thread(target=per_host, args=(name, url), daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def judge(self) -> tuple[list[str], list[str]]:
        """(faults not answered 503 in time, faults not back to 200 in time), as messages."""
        return judge(self.made, self.samples)


def judge(made: list[Fault], samples: list[dict]) -> tuple[list[str], list[str]]:
    """A fault is seen when some host it touches answered 503 to a sample that started
    within DOWN_WITHIN of its start and took at most DOWN_WITHIN; it is healed when every
    such host answered 200 within UP_WITHIN after its end. A dropped broker link on a
    host counts only when the host checks that link (always: /healthz checks both)."""
    late_down, late_up = [], []
    for fault in made:
        touched = [s for s in samples if fault.host in ("*", s["host"])]
        down = [
            s for s in touched
            if fault.start <= s["t"] <= fault.start + DOWN_WITHIN
            and s["status"] == 503 and s["took"] <= DOWN_WITHIN
        ]  # fmt: skip
        if not down:
            late_down.append(f"{fault.kind} on {fault.host} at {fault.start:.1f}: no 503 in time")
        hosts = {s["host"] for s in touched}
        for host in sorted(hosts):
            up = [
                s for s in touched
                if s["host"] == host and fault.end <= s["t"] <= fault.end + UP_WITHIN
                and s["status"] == 200
            ]  # fmt: skip
            if not up:
                late_up.append(f"{fault.kind} on {host} healed at {fault.end:.1f}: no 200 in time")
    return late_down, late_up
