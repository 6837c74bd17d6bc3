"""The chaos run's dependency faults and the /healthz sampler (docs/failure-model.md).

Each host reaches PostgreSQL and the broker through a FaultProxy of its own
(tools/chaos/faultproxy.py), so one host can be partitioned while the other
still works. The kinds:

- `db_partition`: one host's database link blackholed (drop) for 5-30 s, healed;
- `broker_partition`: one host's broker link blackholed for 5-30 s, healed;
- `db_reset`: every connection of one host to the database reset at once,
  and new ones refused for a few seconds (its sessions gone, its
  uncommitted transactions rolled back);
- `pg_crash`: the run's own PostgreSQL SIGKILLed, postmaster and backends
  (tools/chaos/postgres.py), and started again: crash recovery;
- `pg_hang`: the run's PostgreSQL SIGSTOPped, postmaster and backends, for
  4-10 s, then SIGCONT;
- `redis_hang`: the run's own redis-server SIGSTOPped for 5-10 s (the cache on
  both brokers, and the broker itself on Redis), then SIGCONT;
- `memory_alarm` (RabbitMQ only): the shared broker's watermark set very low
  for 3 s and ALWAYS restored (other users of that broker are blocked meanwhile);
- `provider_kill`: the payment simulator SIGKILLed and started again on the
  same ports with its ledger;
- `supervisor_kill`: one host's supervisor SIGKILLed; its children must all
  be gone within a deadline (parent-death signal), then the run starts the
  host again (`restart_host`, which reports orphans itself).

`schedule` lays the faults end to end, never two at once, each followed by
a quiet GAP so that /healthz is judged for one fault at a time: the CI short
form makes the REQUIRED kinds (a database crash, a partition, a hung broker)
and as many others as fit; a run of LONG_FROM seconds or more repeats the
whole cycle until its end, so every kind is made several times.

The sampler asks every host's /healthz every 0.5 s; `judge` checks that each
JUDGED fault was answered 503 within 2 s of its start and 200 within 10 s of
its heal.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from .faultproxy import FaultProxy

SAMPLE_EVERY = 0.5
DOWN_WITHIN = 2.0
UP_WITHIN = 10.0
# Quiet seconds after each fault's planned end: the heal is judged (UP_WITHIN)
# before the next fault starts.
GAP = UP_WITHIN + 2.0
LONG_FROM = 600.0
START_AT = 0.04  # fraction of the run before the first fault
# The supervisor's children stopping (gunicorn's 10 s grace), then its setup
# and programs starting again, until /healthz answers.
SUPERVISOR_SLOT = 30.0
# Faults /healthz must see: a dependency of every request stops answering.
# Not judged: memory_alarm (the broker still accepts connections and
# consumers go on; a blocked publish is bounded by the publish confirm timeout
# instead), provider_kill (the provider is no dependency of /healthz) and
# supervisor_kill (the host itself is gone and comes back).
JUDGED = frozenset(
    {"db_partition", "broker_partition", "db_reset", "pg_crash", "pg_hang", "redis_hang"}
)
# At least one of each group in every run, the CI short form included.
REQUIRED = (("pg_crash",), ("db_partition", "broker_partition"), ("redis_hang", "memory_alarm"))


@dataclass
class Fault:
    kind: str
    host: str  # a host name, or "*" for a shared dependency
    start: float = 0.0
    end: float = 0.0
    seconds: float = 0.0
    note: str = ""


@dataclass(frozen=True)
class Planned:
    """One fault of the schedule: its kind, its host ("*": shared), its planned seconds."""

    kind: str
    host: str
    seconds: float


@dataclass
class Faults:
    proxies: dict[tuple[str, str], FaultProxy]  # (host, "db" | "broker") -> proxy
    hosts: dict[str, str]  # host name -> base URL
    timeline: Callable[[dict], None]
    rng: random.Random
    redis_pid: Callable[[], int | None]
    rabbitmq: bool = False
    postgres: Any = None  # tools.chaos.postgres.ChaosPostgres: crash(), pause(), resume()
    simulator: Any = None  # run.Simulator: kill_and_restart()
    restart_host: Callable[[str], str] | None = None  # SIGKILL its supervisor, start it again
    planned: list[Planned] = field(default_factory=list)
    made: list[Fault] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    # PR_SET_PDEATHSIG (runner.processes.die_with_parent) fires when the THREAD
    # that forked the child ends, not its process: a server started again from
    # a fault's own short-lived thread got its parent-death signal the moment
    # that thread ended (PostgreSQL shut down just after its crash recovery;
    # docs/failure-model.md, "What broke, and what fixed it"). So whatever a
    # fault starts again is started from this one thread, which lives as long
    # as the run.
    skipped: list[str] = field(default_factory=list)
    gap: float = GAP  # quiet seconds after each fault heals
    # One fault at a time, each followed by GAP quiet seconds, even when one
    # outlasts its slot (a supervisor's restart under load took 57 s of its
    # 30): a fault that comes due meanwhile waits its turn.
    _one: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _spawner: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="respawn")
    )

    # -- the schedule ------------------------------------------------------------------

    def kinds(self, *, long: bool) -> list[Planned]:
        """One cycle: every kind this run can make, hosts alternating, lengths drawn."""
        names = sorted(self.hosts)
        first, last = names[0], names[-1]
        longest = 30.0 if long else 10.0
        cycle = [
            Planned("pg_crash", "*", 5.0),
            Planned("db_partition", first, self.rng.uniform(5, longest)),
            Planned("redis_hang", "*", self.rng.uniform(5, 10)),
            Planned("broker_partition", last, self.rng.uniform(5, longest)),
            Planned("pg_hang", "*", self.rng.uniform(4, 10)),
            Planned("supervisor_kill", self.rng.choice(names), SUPERVISOR_SLOT),
            Planned("db_reset", last, 3.0),
            Planned("provider_kill", "*", 2.0),
        ]
        if self.rabbitmq:
            cycle.insert(3, Planned("memory_alarm", "*", 3.0))
        if self.restart_host is None:
            cycle = [p for p in cycle if p.kind != "supervisor_kill"]
        return cycle

    def plan(self, duration: float) -> list[tuple[float, Planned]]:
        """[(seconds from the start, fault)]: end to end, GAP after each, all within the run."""
        long = duration >= LONG_FROM
        at = START_AT * duration
        plan: list[tuple[float, Planned]] = []
        while True:
            cycle = self.kinds(long=long)
            if not long:
                cycle = _fit(cycle, duration - at)
            added = False
            for fault in cycle:
                if at + fault.seconds + GAP > duration:
                    break
                plan.append((at, fault))
                at += fault.seconds + GAP
                added = True
            if not long or not added:
                return plan

    def schedule(self, duration: float) -> list[tuple[float, Callable[[], None]]]:
        plan = self.plan(duration)
        self.planned = [fault for _, fault in plan]
        return [(at, self._action(fault)) for at, fault in plan]

    def _action(self, fault: Planned) -> Callable[[], None]:
        if fault.kind in ("db_partition", "broker_partition"):
            link = fault.kind.split("_")[0]
            return lambda: self.partition(link, fault.host, fault.seconds)
        if fault.kind == "db_reset":
            return lambda: self.db_reset(fault.host, fault.seconds)
        if fault.kind == "redis_hang":
            return lambda: self.redis_hang(fault.seconds)
        if fault.kind == "memory_alarm":
            return lambda: self.memory_alarm(fault.seconds)
        if fault.kind == "pg_crash":
            return self.pg_crash
        if fault.kind == "pg_hang":
            return lambda: self.pg_hang(fault.seconds)
        if fault.kind == "provider_kill":
            return self.provider_kill
        if fault.kind == "supervisor_kill":
            return lambda: self.supervisor_kill(fault.host)
        raise ValueError(f"unknown fault kind {fault.kind!r}")

    def counts(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.made).items()))

    # -- faults (each blocks the calling thread for its length; run from a thread) ---

    def _record(self, fault: Fault) -> None:
        self.made.append(fault)
        self.timeline({"t": fault.start, "type": "fault", "kind": fault.kind,
                       "host": fault.host, "end": fault.end, "note": fault.note})  # fmt: skip

    def _in_thread(self, body: Callable[[], None], kind: str = "") -> None:
        def guarded() -> None:
            with self._one:
                if self._closing.is_set():
                    self.skipped.append(kind)  # its turn came after the run's end
                    return
                try:
                    body()
                except Exception as exc:  # noqa: BLE001 - a fault that could not be made is reported
                    self.problems.append(f"a fault failed: {type(exc).__name__}: {exc}")
                self._closing.wait(self.gap)

        threading.Thread(target=guarded, daemon=True).start()

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

        self._in_thread(body, f"{link}_partition")

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

        self._in_thread(body, "db_reset")

    def pg_crash(self) -> None:
        def body() -> None:
            fault = Fault("pg_crash", "*", time.time())
            try:
                took = self._spawner.submit(self.postgres.crash).result()
                fault.note = f"accepting again after {took:.1f} s (crash recovery)"
            finally:
                fault.end = time.time()
                fault.seconds = fault.end - fault.start
                self._record(fault)

        self._in_thread(body, "pg_crash")

    def pg_hang(self, seconds: float) -> None:
        def body() -> None:
            fault = Fault("pg_hang", "*", time.time(), seconds=seconds)
            stopped = self.postgres.pause()
            try:
                time.sleep(seconds)
            finally:
                self.postgres.resume(stopped)
                fault.end = time.time()
                fault.note = f"{len(stopped)} processes stopped"
                self._record(fault)

        self._in_thread(body, "pg_hang")

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

        self._in_thread(body, "redis_hang")

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

        self._in_thread(body, "memory_alarm")

    def provider_kill(self) -> None:
        def body() -> None:
            fault = Fault("provider_kill", "*", time.time())
            try:
                self._spawner.submit(self.simulator.kill_and_restart).result()
            finally:
                fault.end = time.time()
                fault.seconds = fault.end - fault.start
                self._record(fault)

        self._in_thread(body, "provider_kill")

    def supervisor_kill(self, host: str) -> None:
        assert self.restart_host is not None

        def body() -> None:
            fault = Fault("supervisor_kill", host, time.time())
            try:
                fault.note = self._spawner.submit(self.restart_host, host).result()
            finally:
                fault.end = time.time()
                fault.seconds = fault.end - fault.start
                self._record(fault)

        self._in_thread(body, "supervisor_kill")

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

    def finish(self, timeout: float) -> None:
        """Start no more faults; wait until the one being made has healed."""
        self._closing.set()
        if self._one.acquire(timeout=timeout):
            self._one.release()
        else:
            self.problems.append(f"a fault had not healed {timeout:.0f} s after the run's end")

    def missing(self) -> list[str]:
        """The REQUIRED groups of which no fault was made, as messages."""
        made = {f.kind for f in self.made}
        planned = {p.kind for p in self.planned}
        return [
            f"no {' or '.join(group)} made"
            for group in REQUIRED
            if planned & set(group) and not made & set(group)
        ]

    def stop(self) -> None:
        self._stop.set()

    def judge(
        self, *, server_kills: Iterable[tuple[str, float]] = ()
    ) -> tuple[list[str], list[str]]:
        """(faults not answered 503 in time, faults not back to 200 in time), as messages."""
        supervisors = [(f.host, f.start) for f in self.made if f.kind == "supervisor_kill"]
        return judge(self.made, self.samples, server_kills=[*server_kills, *supervisors])


def judge(
    made: list[Fault], samples: list[dict], *, server_kills: Iterable[tuple[str, float]] = ()
) -> tuple[list[str], list[str]]:
    """A fault is seen when some host it touches answered 503 to a sample that started
    within DOWN_WITHIN of its start and took at most DOWN_WITHIN, or whose 503 arrived
    within DOWN_WITHIN of its start after a 200 (`_answered_503_in_time`); it is healed when every
    such host answered 200 within UP_WITHIN after its end. A dropped broker link on a
    host counts only when the host checks that link (always: /healthz checks both).

    `server_kills`: (host, time) of each SIGKILL of a host's web server by the run (a
    gunicorn worker or master; a killed supervisor takes it down too). No server, or
    one booting again, is no late /healthz: a fault that began just after such a kill
    is seen when the host's first answer after the kill, or one within DOWN_WITHIN of
    it, is a 503 (`_seen_after_a_kill`); a heal near one is counted from the host's
    first answer after the last such kill (`_answering_again`); and a heal whose
    window a later fault on the host cut before any 200 is not judged late.
    """
    killed_on: dict[str, list[float]] = {}
    for host, t in sorted(server_kills, key=lambda k: k[1]):
        killed_on.setdefault(host, []).append(t)
    late_down, late_up = [], []
    for fault in made:
        if fault.kind not in JUDGED:
            continue
        touched = [s for s in samples if fault.host in ("*", s["host"])]
        down = [
            s for s in touched
            if fault.start <= s["t"] <= fault.start + DOWN_WITHIN
            and s["status"] == 503 and s["took"] <= DOWN_WITHIN
        ]  # fmt: skip
        if (
            not down
            and not _answered_503_in_time(fault, touched)
            and not _seen_after_a_kill(fault, touched, killed_on)
        ):
            late_down.append(f"{fault.kind} on {fault.host} at {fault.start:.1f}: no 503 in time")
        hosts = {s["host"] for s in touched}
        for host in sorted(hosts):
            own = sorted((s for s in touched if s["host"] == host), key=lambda s: s["t"])
            start = _answering_again(own, fault.end, killed_on.get(host, []))
            limit = start + UP_WITHIN
            if any(start <= s["t"] <= limit and s["status"] == 200 for s in own):
                continue
            # A later fault on this host began before a 200 was due: it rightly holds
            # /healthz at 503, so this heal cannot be judged (it is not late).
            if start > fault.end and any(
                f.kind in JUDGED and f.host in ("*", host) and fault.end < f.start <= limit
                for f in made
            ):
                continue
            late_up.append(f"{fault.kind} on {host} healed at {fault.end:.1f}: no 200 in time")
    return late_down, late_up


# A web server killed this long before a heal may still be starting again at it
# (gunicorn's master and workers boot in seconds on a loaded machine; a
# supervisor's whole host within SUPERVISOR_SLOT).
KILL_REACH = SUPERVISOR_SLOT


# A web server killed this long before a fault may still be booting when the fault
# begins (a gunicorn worker boots in about 3 s on a loaded machine). An earlier kill
# counts too while the host has not answered since: a killed master is started
# again by its supervisor after a pause, then boots its workers (about 10 s from
# the kill to the first answer; docs/failure-model.md, "Dependency faults").
KILL_REACH_DOWN = 5.0


def _last_kill(killed: list[float], lo: float, hi: float) -> float | None:
    """The last of a host's web-server kills (sorted times) from `lo` to `hi`, if any."""
    near = [t for t in killed if lo <= t <= hi]
    return near[-1] if near else None


def _seen_after_a_kill(
    fault: Fault, touched: list[dict], killed_on: dict[str, list[float]]
) -> bool:
    """A touched host whose web server the run killed from KILL_REACH_DOWN before the
    fault (or earlier, when it has not answered since) to DOWN_WITHIN into it answered
    503 (in at most DOWN_WITHIN once it answered again): its first answer after the
    last such kill, or one within DOWN_WITHIN of it, was a 503 that came after the fault
    began."""
    for host in sorted({s["host"] for s in touched}):
        kill = _last_kill(killed_on.get(host, []), float("-inf"), fault.start + DOWN_WITHIN)
        if kill is None:
            continue
        if kill < fault.start - KILL_REACH_DOWN and any(
            s["host"] == host
            and s["status"] is not None
            and kill <= s["t"] + s["took"] < fault.start
            for s in touched
        ):
            continue  # answering again before the fault began: judged as any host
        answers = sorted(
            (s["t"] + s["took"], s["status"])
            for s in touched
            if s["host"] == host and s["status"] is not None and s["t"] + s["took"] >= kill
        )
        if not answers:
            continue
        first = answers[0][0]
        if any(
            status == 503 and at >= fault.start and at <= first + DOWN_WITHIN
            for at, status in answers
        ):
            return True
        # No server answered from that kill until the fault was over (killed again,
        # or still booting): the host had nothing to say 503 with, and its first
        # answer is the heal's to judge (both of a host's gunicorn workers may exit
        # by failpoints early in a fault and the killer take its master; the run's
        # log: docs/runs/chaos.md).
        if first > fault.end:
            return True
    return False


def failpoint_kills(directory: Path) -> list[tuple[str, float]]:
    """(host, time) of each failpoint exit in a host's web server, from the run's marker
    files (idempotency/failpoints.py writes "<host> <pid> <argv[0]>" into each; the
    file's time is the kernel's, so a skewed host's faketime does not move it). Every
    failpoint of the run exits its process: in a gunicorn worker that is a kill of the
    host's web server as surely as the killer's SIGKILL."""
    kills = []
    for marker in sorted(directory.iterdir()) if directory.is_dir() else []:
        try:
            host, _pid, program = marker.read_text().split(" ", 2)
            at = marker.stat().st_mtime
        except (OSError, ValueError):
            continue  # an older marker without its writer, or one being written
        if host and "gunicorn" in program:
            kills.append((host, at))
    return kills


def _answered_503_in_time(fault: Fault, touched: list[dict]) -> bool:
    """A touched host's answer that *arrived* within DOWN_WITHIN of the fault's start was a
    503, and that host's last answer before the start was a 200 (so the fault made it).

    The sample that straddles the start counts: a fault's only 503 in its first
    2 s may answer a sample sent just before the fault began, while the next
    sample finds the web worker just killed by the run. The host did say 503
    within 2 s, as the contract asks; counting samples by when they were sent
    would miss it (docs/failure-model.md, "Dependency faults").
    """
    for host in sorted({s["host"] for s in touched}):
        answers = sorted(
            (s["t"] + s["took"], s["status"])
            for s in touched
            if s["host"] == host and s["status"] is not None
        )
        before = [status for at, status in answers if at < fault.start]
        if not before or before[-1] != 200:
            continue
        if any(
            status == 503 and fault.start <= at <= fault.start + DOWN_WITHIN
            for at, status in answers
        ):
            return True
    return False


def _answering_again(samples: list[dict], end: float, killed: list[float]) -> float:
    """When a heal's UP_WITHIN starts on a host: the fault's end, or, when the run killed
    the host's web server shortly before or within that window, the host's first
    answer (any status) after the last such kill: no server is no late /healthz."""
    kill = _last_kill(killed, end - KILL_REACH, end + UP_WITHIN)
    if kill is None:
        return end
    after = max(end, kill)
    for sample in samples:
        if sample["t"] >= after and sample["status"] is not None:
            return sample["t"]
    return after


# A web request's deadline on the chaos hosts (WEB_REQUEST_TIMEOUT, core/deadline.py),
# and the slack the issue allows past it. A request is judged when its attempt
# overlapped a dependency fault on its host (or a shared one); a killed
# supervisor is no dependency (the host itself is gone and its requests cut).
REQUEST_DEADLINE = float(os.environ.get("WEB_REQUEST_TIMEOUT", "20"))
HUNG_SLACK = 2.0
NOT_A_DEPENDENCY = frozenset({"supervisor_kill"})


def hung_requests(
    made: list[Fault], answers: list[dict], *, limit: float = REQUEST_DEADLINE + HUNG_SLACK
) -> tuple[int, list[str], list[str]]:
    """(requests judged, messages for those held longer than `limit`, messages for
    those the client saw take longer but the server did not): every attempt that
    overlapped a dependency fault touching its host.

    An answer is judged by how long the server says it had the request (its
    Server-Timing, counted as its deadline counts: core/deadline.py), since that is
    what the deadline bounds; what the client saw beyond it was spent before the
    server took the request (the workload's own process on a loaded machine, the
    kernel's accept queue) and is reported, not judged. An answer without that
    header, and an attempt with no answer, count by how long the client waited (its
    own timeout, 30 s), so a request that hung past the client's patience is one too."""
    faults = [f for f in made if f.kind not in NOT_A_DEPENDENCY]
    judged, late, outside = 0, [], []
    for answer in answers:
        took = answer.get("took")
        if took is None:
            continue
        start, end = answer["t"], answer["t"] + took
        overlapped = [
            f for f in faults
            if f.host in ("*", answer.get("host")) and start < f.end and end > f.start
        ]  # fmt: skip
        if not overlapped:
            continue
        judged += 1
        server_took = answer.get("server_took") if answer.get("status") is not None else None
        held = took if server_took is None else server_took
        message = (
            f"{answer.get('method')} {answer.get('path')} on {answer.get('host')} took"
            f" {took:.1f} s (status {answer.get('status')}"
            + ("" if server_took is None else f", {server_took:.1f} s in the server")
            + f") during {', '.join(sorted({f.kind for f in overlapped}))}"
        )
        if held > limit:
            late.append(message)
        elif took > limit:
            outside.append(message)
    return judged, late, outside


def _fit(cycle: list[Planned], room: float) -> list[Planned]:
    """The cycle cut to `room` seconds: every REQUIRED group first (its first kind
    in the cycle), then the others in cycle order while they fit."""
    required: list[Planned] = []
    for group in REQUIRED:
        found = [p for p in cycle if p.kind in group]
        if found:
            required.append(found[0])
    used = sum(p.seconds + GAP for p in required)
    chosen = set(map(id, required))
    for fault in cycle:
        if id(fault) not in chosen and used + fault.seconds + GAP <= room:
            chosen.add(id(fault))
            used += fault.seconds + GAP
    return [p for p in cycle if id(p) in chosen]


def timings(made: list[Fault], samples: list[dict]) -> list[dict]:
    """Per judged fault: its length, when /healthz first answered 503 on a host it
    touches (seconds after the start, counted to the answer) and when every such host
    answered 200 again after the heal (None: never)."""
    out = []
    for fault in made:
        if fault.kind not in JUDGED:
            continue
        touched = [s for s in samples if fault.host in ("*", s["host"])]
        down = [s["t"] + s["took"] - fault.start for s in touched
                if s["t"] >= fault.start and s["status"] == 503]  # fmt: skip
        # Back up when the last host it touches is back: the slowest host's first 200.
        first_up: list[float | None] = []
        for host in sorted({s["host"] for s in touched}):
            ups = [s["t"] + s["took"] - fault.end for s in touched
                   if s["host"] == host and s["t"] >= fault.end and s["status"] == 200]  # fmt: skip
            first_up.append(min(ups, default=None))
        to_200 = None if None in first_up or not first_up else max(first_up)  # type: ignore[type-var]
        out.append(
            {
                "kind": fault.kind,
                "host": fault.host,
                "seconds": fault.end - fault.start,
                "to_503": min(down, default=None),
                "to_200": to_200,
            }
        )
    return out


def timing_lines(made: list[Fault], samples: list[dict]) -> list[str]:
    """One line per fault kind: how many, how long, the slowest 503 and 200 of /healthz."""
    by_kind: dict[str, list[dict]] = {}
    for row in timings(made, samples):
        by_kind.setdefault(row["kind"], []).append(row)
    for fault in made:
        if fault.kind not in JUDGED:
            by_kind.setdefault(fault.kind, []).append({"seconds": fault.end - fault.start})

    def worst(values: list[float | None]) -> str:
        if not values:
            return "-"
        if any(v is None for v in values):
            return "never"
        return f"{max(v for v in values if v is not None):.1f} s"

    lines = []
    for kind, items in sorted(by_kind.items()):
        lengths = [i["seconds"] for i in items]
        line = f"{kind} ×{len(items)}: {min(lengths):.1f}-{max(lengths):.1f} s"
        if kind in JUDGED:
            down, up = worst([i["to_503"] for i in items]), worst([i["to_200"] for i in items])
            line += f"; /healthz 503 after {down}, 200 after the heal {up} (slowest of each)"
        lines.append(line)
    return lines
