"""Requests gunicorn refuses before Django sees them still answer problem+json (real gunicorn)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _raw(url: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes (no client library would send these requests); return the answer."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


def _assert_problem(answer, status: int, code: str) -> dict:
    got_status, headers, body = answer
    assert got_status == status, (got_status, body[:300])
    assert headers["content-type"] == "application/problem+json"
    assert int(headers["content-length"]) == len(body)
    problem = json.loads(body)
    assert problem["status"] == status
    assert problem["code"] == code
    assert problem["type"].endswith(code.replace("_", "-"))
    assert problem["title"] and problem["detail"]
    return problem


def _get(path: str, headers: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}\r\n".encode()


def test_long_request_line_long_or_many_headers_and_garbage_answer_problem_json(gunicorn):
    server = gunicorn()
    long_path = "/api/v1/products/?q=" + "x" * 6 * 1024
    _assert_problem(
        _raw(server.url, _get(long_path)),
        414,
        "uri_too_long",
    )
    long_header = "X-Big: " + "y" * 9000
    _assert_problem(
        _raw(server.url, _get("/healthz", f"{long_header}\r\n")),
        431,
        "header_fields_too_large",
    )
    many = "".join(f"X-H{i}: v\r\n" for i in range(150))
    _assert_problem(
        _raw(server.url, _get("/healthz", many)),
        431,
        "header_fields_too_large",
    )
    _assert_problem(_raw(server.url, b"NOT A REQUEST\r\n\r\n"), 400, "invalid_request")
    # An ordinary request is untouched by all this.
    status, headers, _ = _raw(server.url, _get("/healthz"))
    assert status == 200, server.log()
