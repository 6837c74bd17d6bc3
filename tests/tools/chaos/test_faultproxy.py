"""The chaos run's fault proxy: pass, drop (blackhole), reset, delay, heal."""

from __future__ import annotations

import contextlib
import socket
import threading

import pytest

from tools.chaos.faultproxy import FaultProxy


@pytest.fixture
def echo():
    """A TCP echo server on a free port (threads, stopped at the end)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


@pytest.fixture
def proxy(echo):
    p = FaultProxy(target=("127.0.0.1", echo)).start()
    yield p
    p.stop()


def client(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    return sock


def roundtrip(sock: socket.socket, data: bytes = b"ping") -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def test_pass_through(proxy):
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_drop_holds_open_connections_and_new_ones_then_heal_delivers(proxy):
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.drop()
        sock.settimeout(0.5)
        sock.sendall(b"lost?")
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        # A new connection is accepted (the connect succeeds) and hangs too.
        with client(proxy) as fresh:
            fresh.settimeout(0.5)
            fresh.sendall(b"hello")
            with pytest.raises(TimeoutError):
                fresh.recv(4096)
            proxy.heal()
            fresh.settimeout(5)
            assert fresh.recv(4096) == b"hello"
        sock.settimeout(5)
        assert sock.recv(4096) == b"lost?"  # held, not lost: TCP retransmits after a heal


def test_reset_closes_open_connections_and_refuses_new_ones_until_heal(proxy):
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"
        proxy.reset()
        with pytest.raises((ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            sock.sendall(b"x")
            if not sock.recv(4096):
                raise ConnectionResetError("closed")
    # A new connection is refused: at the connect itself when the proxy's reset
    # comes back before it returns (a loaded machine), else at the first send or read.
    with pytest.raises((ConnectionResetError, BrokenPipeError, ConnectionRefusedError)):
        with client(proxy) as sock:
            sock.sendall(b"x")
            if not sock.recv(4096):
                raise ConnectionResetError("closed")
    proxy.heal()
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"


def test_delay_still_delivers(proxy):
    proxy.delayed(0.05)
    with client(proxy) as sock:
        assert roundtrip(sock) == b"ping"
    proxy.heal()
    assert proxy.delay == 0.0


def test_unknown_mode_is_refused(proxy):
    with pytest.raises(ValueError):
        proxy.set_mode("explode")


def test_connections_beyond_the_bound_are_closed(echo):
    p = FaultProxy(target=("127.0.0.1", echo), max_connections=1).start()
    try:
        with client(p) as first:
            assert roundtrip(first) == b"ping"
            with client(p) as second:
                second.sendall(b"x")
                assert second.recv(4096) == b""  # closed on accept
    except ConnectionResetError:
        pass
    finally:
        p.stop()
