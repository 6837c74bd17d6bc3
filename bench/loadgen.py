"""A small HTTP/1.1 load generator for loopback servers: closed loop, and open loop.

`concurrency` threads each send one request, wait for the whole response,
record its latency and status, and send the next, until the duration is over
or `max_requests` have been started (whichever comes first; a hard time cap
bounds every run). Requests are pre-encoded bytes on raw sockets: no
http.client header parsing, so the generator's own CPU per request stays
small. Keep-alive is used when the server allows it; gunicorn's sync workers
close every connection, so there each request also pays a TCP connect, as a
real client of such a server does.

`open_loop` is the open loop: calls due at a fixed rate whatever the
answers, latency counted from the due time; `run_open` sends one request per
call (the sustained scenario), both share the closed loop's connection and
its handling of a request that got no answer (`NO_ANSWER`).

Only loopback addresses are accepted: this is a benchmark tool, not a way to
load someone else's server.
"""

from __future__ import annotations

import ipaddress
import itertools
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# Every run ends by itself after at most this long, whatever the arguments.
HARD_CAP_SECONDS = 600.0
_RECV = 65536
# A keep-alive connection idle longer than this is not reused: gunicorn closes an
# idle one after its `keepalive` (2 s by default), and a request sent as it closes
# gets no answer. An open loop at a low rate leaves connections idle that long.
IDLE_REUSE_S = 1.0


class ProtocolError(Exception):
    """The server's answer is not the HTTP/1.1 this client understands."""


@dataclass(frozen=True)
class Request:
    """One HTTP request to send; `path` includes any query string."""

    method: str = "GET"
    path: str = "/"
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None

    def encode(self, host_header: str, prefix: str = "") -> bytes:
        """Return the request's bytes; `prefix` is the base URL's path, if any."""
        lines = [
            f"{self.method} {prefix}{self.path} HTTP/1.1",
            f"Host: {host_header}",
            "User-Agent: shop-bench",
            "Accept: application/json",
        ]
        lines.extend(f"{name}: {value}" for name, value in self.headers.items())
        body = self.body or b""
        if body or self.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass(frozen=True)
class Response:
    """What `on_response` callbacks receive."""

    status: int
    body: bytes
    headers: Mapping[str, str]


@dataclass
class LoadResult:
    """Figures of one load run; `latencies_ms` holds only measured requests."""

    label: str
    concurrency: int
    elapsed_s: float
    statuses: Counter
    errors: Counter
    latencies_ms: list[float]
    expected: tuple[int, ...]
    client_cpu_s: float
    extra: dict = field(default_factory=dict)

    @property
    def requests(self) -> int:
        """Requests answered with a status (expected or not) in the measured window."""
        return sum(self.statuses.values())

    @property
    def rps(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def unexpected(self) -> int:
        """Answers whose status is not in `expected`."""
        return sum(n for code, n in self.statuses.items() if code not in self.expected)

    @property
    def error_count(self) -> int:
        """Requests that got no answer (refused, reset, timed out, garbled)."""
        return sum(self.errors.values())

    def percentile(self, q: float) -> float | None:
        """Return the nearest-rank q-th percentile latency in ms (None without samples)."""
        return _nearest_rank(sorted(self.latencies_ms), q)

    def as_dict(self) -> dict:
        """Return the figures as JSON-ready data (what scenarios put in their `runs`)."""
        lat = sorted(self.latencies_ms)

        def pct(q: float) -> float | None:
            value = _nearest_rank(lat, q)
            return None if value is None else round(value, 3)

        return {
            "label": self.label,
            "concurrency": self.concurrency,
            "elapsed_s": round(self.elapsed_s, 3),
            "requests": self.requests,
            "rps": round(self.rps, 1),
            "latency_ms": {
                "p50": pct(50),
                "p90": pct(90),
                "p99": pct(99),
                "max": round(lat[-1], 3) if lat else None,
                "mean": round(sum(lat) / len(lat), 3) if lat else None,
            },
            "status": {str(code): n for code, n in sorted(self.statuses.items())},
            "expected_status": list(self.expected),
            "unexpected": self.unexpected,
            "errors": dict(self.errors),
            "client_cpu_s": round(self.client_cpu_s, 3),
            **self.extra,
        }

    def summary(self) -> str:
        p50, p99 = self.percentile(50), self.percentile(99)
        fmt = "{:.1f}".format
        return (
            f"{self.label} c={self.concurrency}: {self.rps:.1f} req/s, "
            f"p50 {fmt(p50) if p50 is not None else '-'} ms, "
            f"p99 {fmt(p99) if p99 is not None else '-'} ms, "
            f"status {dict(sorted(self.statuses.items()))}, "
            f"errors {dict(self.errors) or 0}"
        )


def _nearest_rank(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[min(len(ordered), max(1, rank)) - 1]


def check_loopback(host: str) -> None:
    """Refuse any host that is not a loopback address."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host!r}") from exc
    for info in infos:
        address = info[4][0].split("%")[0]
        if not ipaddress.ip_address(address).is_loopback:
            raise ValueError(f"{host!r} is not a loopback address; bench only loads loopback")


def _target(base_url: str) -> tuple[str, int, str, str]:
    """(host, port, path prefix, Host header) of a loopback http:// base URL; else ValueError."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"only http://<loopback>:<port> URLs are supported, not {base_url!r}")
    host, port = parts.hostname, parts.port or 80
    check_loopback(host)
    host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return host, port, parts.path.rstrip("/"), host_header


# What a request that got no answer raises: counted by kind, the run goes on.
NO_ANSWER = (OSError, ProtocolError, ValueError)


class _Connection:
    """One keep-alive-if-allowed connection of one worker thread."""

    def __init__(self, host: str, port: int, timeout: float):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self.used_at = 0.0

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def exchange(self, payload: bytes, want_headers: bool) -> tuple[int, bytes, dict]:
        if self.sock is not None and time.monotonic() - self.used_at > IDLE_REUSE_S:
            # The server may be closing it: a browser opens a new one after an idle spell.
            self.close()
        if self.sock is None:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = sock
        sock = self.sock
        sock.sendall(payload)
        buf = b""
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            chunk = sock.recv(_RECV)
            if not chunk:
                raise ProtocolError("connection closed before the response head")
            buf += chunk
        head = buf[:end].decode("latin-1").split("\r\n")
        rest = buf[end + 4 :]
        parts = head[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ProtocolError(f"bad status line {head[0]!r}")
        status = int(parts[1])
        length = None
        chunked = False
        close = parts[0] == "HTTP/1.0"
        headers: dict = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                lowered = value.lower()
                close = "close" in lowered or (close and "keep-alive" not in lowered)
            if want_headers:
                headers[name] = value
        if chunked:
            body = self._read_chunked(rest)
        elif length is not None:
            while len(rest) < length:
                chunk = sock.recv(_RECV)
                if not chunk:
                    raise ProtocolError("connection closed inside the body")
                rest += chunk
            body = rest[:length]
        elif status in (204, 304) or 100 <= status < 200:
            body = b""
        else:
            chunks = [rest]
            while chunk := sock.recv(_RECV):
                chunks.append(chunk)
            body = b"".join(chunks)
            close = True
        if close:
            self.close()
        self.used_at = time.monotonic()
        return status, body, headers

    def send(self, payload: bytes, want_headers: bool) -> tuple[int, bytes, dict] | str:
        """`exchange`, or the kind of failure (the connection closed) when no answer came."""
        try:
            return self.exchange(payload, want_headers)
        except NO_ANSWER as exc:
            self.close()
            return type(exc).__name__

    def _read_chunked(self, rest: bytes) -> bytes:
        body = []
        while True:
            while b"\r\n" not in rest:
                rest += self._recv_or_fail()
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(rest) < size + 2:
                rest += self._recv_or_fail()
            body.append(rest[:size])
            rest = rest[size + 2 :]
            if size == 0:
                # Trailers are not used by the shop; the final CRLF was consumed.
                return b"".join(body)

    def _recv_or_fail(self) -> bytes:
        chunk = self.sock.recv(_RECV)
        if not chunk:
            raise ProtocolError("connection closed inside a chunked body")
        return chunk


def run_load(
    base_url: str,
    *,
    requests: Iterable[Request] | None = None,
    factory: Callable[[int, int], Request] | None = None,
    concurrency: int = 1,
    duration: float | None = None,
    max_requests: int | None = None,
    warmup: float = 0.0,
    timeout: float = 10.0,
    expected: Iterable[int] = (200,),
    on_response: Callable[[Request, Response], None] | None = None,
    on_measure_start: Callable[[], None] | None = None,
    label: str = "load",
) -> LoadResult:
    """Load `base_url` (loopback only) and return the measured figures.

    Give either `requests` (cycled, each worker starting at a different one)
    or `factory(worker_index, sequence_number) -> Request` (called in the
    worker thread, e.g. to mint a fresh Idempotency-Key per request). The run
    ends at `warmup + duration` seconds or after `max_requests` requests
    (counting warm-up ones), whichever comes first, and never later than
    HARD_CAP_SECONDS. Requests started during the warm-up are not measured.
    `on_response(request, response)` runs in the worker thread for every
    measured answer, after its latency is taken (keep it cheap all the same:
    it delays that worker's next request). An exception in `factory` or
    `on_response` stops the run and is raised here. `on_measure_start()` is
    called from the calling thread when the warm-up is over (e.g. to read the
    server's CPU counters); `client_cpu_s` counts from that moment too.
    """
    if duration is None and max_requests is None:
        raise ValueError("give a duration or max_requests: a run must end by itself")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    host, port, prefix, host_header = _target(base_url)
    if (requests is None) == (factory is None):
        raise ValueError("give either requests or factory")
    if requests is not None:
        # Encode once: the cycle of fixed requests costs no formatting per request.
        fixed = [(request, request.encode(host_header, prefix)) for request in requests]
        if not fixed:
            raise ValueError("no requests to send")

        def next_payload(index: int, seq: int) -> tuple[Request, bytes]:
            return fixed[(index + seq) % len(fixed)]
    else:

        def next_payload(index: int, seq: int) -> tuple[Request, bytes]:
            request = factory(index, seq)
            return request, request.encode(host_header, prefix)

    expected = tuple(expected)
    want_headers = on_response is not None

    start = time.perf_counter()
    measure_from = start + warmup
    limit = min(warmup + duration if duration is not None else HARD_CAP_SECONDS, HARD_CAP_SECONDS)
    deadline = start + limit
    tickets = itertools.count()
    stop = threading.Event()
    per_worker: list[tuple[list[float], Counter, Counter]] = []
    failures: list[BaseException] = []

    def work(index: int) -> None:
        latencies: list[float] = []
        statuses: Counter = Counter()
        errors: Counter = Counter()
        per_worker.append((latencies, statuses, errors))
        conn = _Connection(host, port, timeout)
        seq = 0
        perf = time.perf_counter
        try:
            while not stop.is_set():
                t0 = perf()
                if t0 >= deadline:
                    break
                if max_requests is not None and next(tickets) >= max_requests:
                    break
                request, payload = next_payload(index, seq)
                seq += 1
                t0 = perf()
                answer = conn.send(payload, want_headers)
                if isinstance(answer, str):
                    if t0 >= measure_from:
                        errors[answer] += 1
                    continue
                status, body, headers = answer
                if t0 >= measure_from:
                    latencies.append((perf() - t0) * 1000.0)
                    statuses[status] += 1
                    if on_response is not None:
                        on_response(request, Response(status, body, headers))
        except BaseException as exc:  # noqa: BLE001 - re-raised by run_load
            # A factory or on_response bug stops the whole run and surfaces.
            failures.append(exc)
            stop.set()
        finally:
            conn.close()

    threads = [
        threading.Thread(target=work, args=(i,), name=f"loadgen-{i}", daemon=True)
        for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    try:
        # Sit out the warm-up, so CPU figures cover the measured window only.
        for thread in threads:
            thread.join(max(0.0, measure_from - time.perf_counter()))
        cpu0 = time.process_time()
        if on_measure_start is not None:
            on_measure_start()
        for thread in threads:
            thread.join()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout + 1.0)
    end = time.perf_counter()
    cpu = time.process_time() - cpu0
    if failures:
        raise failures[0]

    latencies: list[float] = []
    statuses: Counter = Counter()
    errors: Counter = Counter()
    for worker_latencies, worker_statuses, worker_errors in per_worker:
        latencies.extend(worker_latencies)
        statuses.update(worker_statuses)
        errors.update(worker_errors)
    return LoadResult(
        label=label,
        concurrency=concurrency,
        elapsed_s=max(0.0, end - max(measure_from, start)),
        statuses=statuses,
        errors=errors,
        latencies_ms=latencies,
        expected=expected,
        client_cpu_s=cpu,
    )


@dataclass
class OpenLoadResult:
    """What an open-loop run (`run_open`) measured: one sample per request sent.

    `samples` are (due, latency_ms, status) with `due` the second of the run
    the request was due at and the latency counted from then, not from when a
    thread was free to send it: a server that falls behind shows as latency,
    not as a lower rate (no coordinated omission). `status` is None when the
    request got no answer (`errors` counts those by kind).
    """

    rate: float
    duration_s: float
    samples: list[tuple[float, float, int | None]]
    errors: Counter
    late_starts: int
    client_cpu_s: float

    @property
    def statuses(self) -> Counter:
        return Counter(status for _, _, status in self.samples if status is not None)


def open_loop(
    send: Callable[[int], int | str],
    *,
    rate: float,
    duration: float,
    max_in_flight: int = 64,
    timeout: float = 10.0,
) -> OpenLoadResult:
    """Call `send(n)` for n = 0, 1, ... at `rate` calls/s for `duration` s, open loop.

    Call n is due at n / rate seconds after the start, whatever the earlier
    calls take; up to `max_in_flight` threads make them. When every thread is
    busy a due call waits for one, and that wait is part of its latency
    (`late_starts` counts calls made more than 10 ms after their due time).
    `send(n)` returns the answer's status, or the kind of failure (a str,
    counted in `errors`) when there was no answer; an exception it raises
    stops the run and is raised here. `run_open` is this with one HTTP request
    per call; a peer's whole checkout (bench/scenarios/oscar_sustained.py) is
    another `send`.
    """
    if rate <= 0 or duration <= 0:
        raise ValueError("rate and duration must be positive")
    if max_in_flight < 1:
        raise ValueError("max_in_flight must be at least 1")
    total = int(rate * min(duration, HARD_CAP_SECONDS))
    tickets = itertools.count()
    lock = threading.Lock()
    samples: list[tuple[float, float, int | None]] = []
    errors: Counter = Counter()
    late = [0]
    failures: list[BaseException] = []
    stop = threading.Event()
    start = time.perf_counter() + 0.05  # every thread is up before the first is due

    def work() -> None:
        perf = time.perf_counter
        try:
            while not stop.is_set():
                with lock:
                    n = next(tickets)
                if n >= total:
                    break
                due = start + n / rate
                wait = due - perf()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -0.01:
                    with lock:
                        late[0] += 1
                answer = send(n)
                latency_ms = (perf() - due) * 1000.0
                status = None if isinstance(answer, str) else answer
                with lock:
                    if isinstance(answer, str):
                        errors[answer] += 1
                    samples.append((due - start, latency_ms, status))
        except BaseException as exc:  # noqa: BLE001 - re-raised by open_loop
            failures.append(exc)
            stop.set()

    threads = [
        threading.Thread(target=work, name=f"openload-{i}", daemon=True)
        for i in range(min(max_in_flight, max(1, total)))
    ]
    cpu0 = time.process_time()
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout + 1.0)
    if failures:
        raise failures[0]
    samples.sort()
    return OpenLoadResult(
        rate=rate,
        duration_s=total / rate,
        samples=samples,
        errors=errors,
        late_starts=late[0],
        client_cpu_s=time.process_time() - cpu0,
    )


def run_open(
    base_url: str,
    *,
    factory: Callable[[int], Request],
    rate: float,
    duration: float,
    max_in_flight: int = 64,
    timeout: float = 10.0,
) -> OpenLoadResult:
    """Send `factory(n)` for n = 0, 1, ... at `rate` requests/s for `duration` s, open loop.

    `open_loop` with one request per call, each thread on its own connection
    (keep-alive when the server allows it, as `run_load`'s). Loopback only,
    like `run_load`.
    """
    host, port, prefix, host_header = _target(base_url)
    local = threading.local()
    connections: list[_Connection] = []
    lock = threading.Lock()

    def send(n: int) -> int | str:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = _Connection(host, port, timeout)
            with lock:
                connections.append(conn)
        answer = conn.send(factory(n).encode(host_header, prefix), False)
        return answer if isinstance(answer, str) else answer[0]

    try:
        return open_loop(
            send, rate=rate, duration=duration, max_in_flight=max_in_flight, timeout=timeout
        )
    finally:
        for conn in connections:
            conn.close()
