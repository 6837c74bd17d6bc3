"""The chaos driver's pure parts: options, answers' finality, process roles, the plot."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tools.chaos import plot
from tools.chaos.killer import role_of
from tools.chaos.run import parse_args
from tools.chaos.workload import Answer, AnswerLog, Client, _final


def test_long_means_at_least_30_minutes_on_two_hosts():
    args = parse_args(["--long", "--hosts", "1", "--duration", "60", "--seed", "3"])
    assert (args.duration, args.hosts, args.seed, args.shoppers) == (1800.0, 2, 3, 12)
    assert parse_args([]).duration == 180.0


@pytest.mark.parametrize(
    ("status", "code", "final"),
    [
        (201, None, True),
        (409, "insufficient_stock", True),
        (409, "idempotency_key_in_use", False),
        (None, None, False),
        (500, "internal_error", False),
        (422, "idempotency_key_reused", True),
    ],
)
def test_only_final_answers_end_the_retries(status, code, final):
    assert _final(Answer(status, {"code": code} if code else {}, False)) is final


class FakeProcess:
    def __init__(self, cmdline):
        self._cmdline = cmdline

    def cmdline(self):
        return self._cmdline


@pytest.mark.parametrize(
    ("cmdline", "parent", "role"),
    [
        (["python", "-m", "gunicorn", "config.wsgi:application"], None, "web-master"),
        (["gunicorn: worker [config.wsgi:application]"], "web-master", "web-worker"),
        (["python", "-m", "celery", "--app", "config.celery:app", "worker"], None, "worker-main"),
        (["python", "-m", "celery", "--app", "config.celery:app", "worker"], "worker-main",
         "worker-child"),
        (["python", "-m", "celery", "--app", "config.celery:app", "beat"], None, "beat"),
        (["python", "manage.py", "relay_outbox"], None, "relay"),
        (["python", "-m", "devtools.simulator"], None, None),
    ],
)  # fmt: skip
def test_roles_come_from_the_command_line(cmdline, parent, role):
    assert role_of(FakeProcess(cmdline), parent) == role


class Echo(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        payload = json.dumps({"got": body, "key": self.headers.get("Idempotency-Key")}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_every_attempt_is_one_line_of_the_interface(tmp_path):
    import random

    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log = AnswerLog(tmp_path / "answers.jsonl")
    hosts = {"a": f"http://127.0.0.1:{server.server_address[1]}", "b": "http://127.0.0.1:9"}
    client = Client(actor="ann", token="t", hosts=hosts, log=log, rng=random.Random(1))
    try:
        client.send("checkout", "POST", "/x/", body={"n": 1}, key="k1", host="a")
        client.send("checkout", "POST", "/x/", body={"n": 1}, key="k1", host="b")  # refused
    finally:
        server.shutdown()
        log.close()
    first, second = (json.loads(line) for line in (tmp_path / "answers.jsonl").open())
    keys = {
        "t",
        "host",
        "actor",
        "kind",
        "method",
        "path",
        "key",
        "status",
        "replayed",
        "body",
        "took",
        "server_took",
    }
    assert set(first) == keys == set(second)
    assert first["status"] == 201 and first["replayed"] is True and first["host"] == "a"
    assert first["body"] == {"got": {"n": 1}, "key": "k1"}
    assert second["status"] is None and second["body"] is None and second["host"] == "b"
    # No Server-Timing from this server, and no answer at all from the second.
    assert first["server_took"] is None and second["server_took"] is None


def test_the_plot_is_drawn_from_the_run_files(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the tooling lock: make tools")
    t0 = time.time()
    with (tmp_path / "answers.jsonl").open("w") as f:
        for i, status in enumerate([201, 201, 409, None, 500, 200]):
            f.write(json.dumps({"t": t0 + i * 3, "status": status}) + "\n")
    with (tmp_path / "timeline.jsonl").open("w") as f:
        for record in [
            {"t": t0, "type": "workload_start"},
            {"t": t0 + 4, "type": "kill", "target": "relay"},
            {"t": t0 + 8, "type": "redis_restart"},
        ]:
            f.write(json.dumps(record) + "\n")
    out = plot.plot(tmp_path, title="test")
    assert out == tmp_path / "chaos.png" and out.stat().st_size > 1000
