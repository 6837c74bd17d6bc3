"""The load generator against a tiny local HTTP server (no Django, no database)."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.loadgen import LoadResult, Request, open_loop, run_load


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive unless a path asks to close
    # One buffered write per response, no Nagle: no 40 ms delayed-ACK stalls.
    wbufsize = -1
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, *, close: bool = False, chunked: bool = False):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        if close:
            self.send_header("Connection", "close")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in (body[:3], body[3:]):
                self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        if close:
            self.close_connection = True

    def do_GET(self):
        self.server.hits += 1
        if self.path == "/ok":
            self._send(200, b'{"ok": true}')
        elif self.path == "/close":
            self._send(200, b'{"closed": true}', close=True)
        elif self.path == "/chunked":
            self._send(200, b'{"chunked": true}', chunked=True)
        else:
            self._send(404, b'{"code": "not_found"}')

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        echo = {"seq": self.headers["X-Seq"], "body": body.decode()}
        self._send(201, json.dumps(echo).encode())


class _Url(str):
    """The server's base URL, which also carries the server (for its hit count)."""

    def __new__(cls, url, server):
        self = super().__new__(cls, url)
        self.server = server
        return self


@pytest.fixture
def server_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.hits = 0
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield _Url(f"http://127.0.0.1:{server.server_address[1]}", server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_max_requests_bounds_the_run_and_statuses_are_counted(server_url):
    result = run_load(
        server_url,
        requests=[Request(path="/ok"), Request(path="/missing")],
        concurrency=3,
        max_requests=60,
    )

    assert result.requests == 60
    # Which worker draws which ticket varies, so the split between the two paths does too.
    assert result.statuses.keys() == {200, 404}
    assert result.unexpected == result.statuses[404]
    assert result.error_count == 0
    assert len(result.latencies_ms) == 60
    data = result.as_dict()
    assert data["status"] == {"200": result.statuses[200], "404": result.statuses[404]}
    assert 0 < data["latency_ms"]["p50"] <= data["latency_ms"]["p99"] <= data["latency_ms"]["max"]
    assert data["rps"] > 0
    json.dumps(data)


def test_closed_keep_alive_and_chunked_responses_are_read_whole(server_url):
    bodies = []
    result = run_load(
        server_url,
        requests=[Request(path="/close"), Request(path="/chunked"), Request(path="/ok")],
        concurrency=1,
        max_requests=9,
        on_response=lambda request, response: bodies.append((request.path, response.body)),
    )

    assert result.statuses == {200: 9}
    assert result.error_count == 0
    assert set(bodies) == {
        ("/close", b'{"closed": true}'),
        ("/chunked", b'{"chunked": true}'),
        ("/ok", b'{"ok": true}'),
    }


def test_factory_builds_each_request_with_its_own_headers_and_body(server_url):
    seen = []
    lock = threading.Lock()

    def factory(worker: int, seq: int) -> Request:
        return Request(
            method="POST",
            path="/echo",
            headers={"X-Seq": f"{worker}-{seq}", "Content-Type": "application/json"},
            body=json.dumps({"n": seq}).encode(),
        )

    def on_response(request, response):
        with lock:
            seen.append((request.headers["X-Seq"], json.loads(response.body)))
        assert response.headers["content-type"] == "application/json"

    result = run_load(
        server_url,
        factory=factory,
        concurrency=2,
        max_requests=10,
        expected=(201,),
        on_response=on_response,
    )

    assert result.statuses == {201: 10}
    assert result.unexpected == 0
    assert len(seen) == 10
    for seq_header, echo in seen:
        assert echo["seq"] == seq_header
        assert json.loads(echo["body"]) == {"n": int(seq_header.split("-")[1])}


def test_refused_connections_are_errors_not_statuses():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port now

    result = run_load(f"http://127.0.0.1:{port}", requests=[Request()], max_requests=5)

    assert result.requests == 0
    assert result.errors == {"ConnectionRefusedError": 5}
    assert result.as_dict()["latency_ms"]["p50"] is None


def test_duration_ends_the_run_by_itself(server_url):
    result = run_load(server_url, requests=[Request(path="/ok")], concurrency=2, duration=0.2)

    assert result.requests > 0
    assert result.statuses.keys() == {200}
    assert 0.1 < result.elapsed_s < 30


def test_warm_up_requests_are_sent_but_not_measured(server_url):
    calls = []

    result = run_load(
        server_url,
        requests=[Request(path="/ok")],
        duration=0.2,
        warmup=0.2,
        on_measure_start=lambda: calls.append(server_url.server.hits),
    )

    assert len(calls) == 1 and calls[0] > 0  # called once, after warm-up requests were served
    assert 0 < result.requests < server_url.server.hits


@pytest.mark.parametrize(
    "url, kwargs",
    [
        ("http://10.1.2.3:80", {"max_requests": 1}),
        ("http://192.0.2.1:8000", {"duration": 1}),
        ("https://127.0.0.1:443", {"max_requests": 1}),
        ("http://127.0.0.1:1", {}),
    ],
)
def test_refuses_non_loopback_targets_and_unbounded_runs(url, kwargs):
    with pytest.raises(ValueError):
        run_load(url, requests=[Request()], **kwargs)


def test_requests_or_factory_exactly_one(server_url):
    with pytest.raises(ValueError):
        run_load(server_url, max_requests=1)
    with pytest.raises(ValueError):
        run_load(server_url, requests=[Request()], factory=lambda w, s: Request(), max_requests=1)


def test_percentiles_are_nearest_rank():
    result = LoadResult(
        label="x",
        concurrency=1,
        elapsed_s=1.0,
        statuses={200: 100},
        errors={},
        latencies_ms=[float(n) for n in range(100, 0, -1)],
        expected=(200,),
        client_cpu_s=0.0,
    )

    assert result.percentile(50) == 50.0
    assert result.percentile(99) == 99.0
    assert result.percentile(100) == 100.0
    assert result.as_dict()["latency_ms"] == {
        "p50": 50.0,
        "p90": 90.0,
        "p99": 99.0,
        "max": 100.0,
        "mean": 50.5,
    }


def test_an_exception_in_a_callback_stops_the_run_and_is_raised(server_url):
    def on_response(request, response):
        raise RuntimeError("invariant broken")

    with pytest.raises(RuntimeError, match="invariant broken"):
        run_load(
            server_url,
            requests=[Request(path="/ok")],
            concurrency=2,
            duration=30,
            on_response=on_response,
        )


def test_the_open_loop_calls_any_sender_and_counts_its_failures_by_kind():

    def send(n: int) -> int | str:
        time.sleep(0.02)
        return "TimeoutError" if n % 5 == 4 else 302

    result = open_loop(send, rate=50, duration=0.4, max_in_flight=4)

    assert len(result.samples) == 20 and result.statuses == {302: 16}
    assert result.errors == {"TimeoutError": 4}
    assert [s for _, _, s in result.samples].count(None) == 4
    assert all(latency >= 20 for _, latency, _ in result.samples)


def test_a_sender_that_raises_stops_the_open_loop_and_is_raised():

    def send(n: int) -> int:
        raise KeyError(n)

    with pytest.raises(KeyError):
        open_loop(send, rate=50, duration=0.2, max_in_flight=2)
