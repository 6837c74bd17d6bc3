"""The chaos run's fault proxy: pass, drop (blackhole), reset, delay, heal."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

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


def _reset(sock: socket.socket) -> None:
    """Close with a TCP RST, as a process killed with unread bytes in its socket does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.fixture
def silent():
    """A server that accepts and never sends (an idle PostgreSQL session); its connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    accepted: list[socket.socket] = []
    thread = threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    for conn in accepted:
        conn.close()
    server.close()


def _upstream_closed_after_client_reset(proxy_class: type[FaultProxy], silent) -> bool:
    port, accepted = silent
    proxy = proxy_class(target=("127.0.0.1", port)).start()
    try:
        sock = client(proxy)
        sock.sendall(b"BEGIN")
        deadline = time.monotonic() + 5
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.01)
        upstream = accepted[0]
        assert upstream.recv(16) == b"BEGIN"
        _reset(sock)
        upstream.settimeout(2)
        try:
            return upstream.recv(16) == b""  # EOF: the proxy closed it
        except ConnectionResetError:
            return True  # RST: the proxy reset it
        except TimeoutError:
            return False  # still open: the server keeps the gone client's session
    finally:
        proxy.stop()


class _NoResetPropagation(FaultProxy):
    """Wrong twin: the pipe as it was, a reset side leaves the other side open."""

    async def _pipe(self, reader, writer) -> None:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(Exception):
            writer.write_eof()


def test_a_client_that_resets_resets_its_upstream_connection(silent):
    assert _upstream_closed_after_client_reset(FaultProxy, silent)


def test_wrong_twin_without_propagating_the_reset_the_upstream_stays_open(silent):
    assert not _upstream_closed_after_client_reset(_NoResetPropagation, silent)
