"""A TCP proxy that makes network faults on command (chaos run only; dev tooling).

One listening port per link (a host to PostgreSQL, a host to the broker). The
chaos hosts' settings URLs point at it; production code knows nothing of it.
Modes, switched at any moment from another thread:

- `pass`: bytes flow both ways (with `delay` seconds added to each chunk, 0 by default);
- `drop` (blackhole, a partition): connections stay open, nothing passes in
  either direction, new connections are accepted and then hang as well;
- `reset`: every open connection is closed at once (RST) and new ones are
  refused by closing them on accept, until the next mode change;
- `heal`: back to `pass`, delay 0.

Bounded: at most `max_connections` open at once (more are closed on accept),
every read at most 64 KiB, and while dropping one read per direction is held
(then the kernels' socket buffers fill and the senders block, as on a link
that lost every packet).

    proxy = FaultProxy(target=("127.0.0.1", 5432)); proxy.start()   # proxy.port
    proxy.drop(); ...; proxy.heal(); proxy.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from urllib.parse import urlsplit

CHUNK = 64 * 1024


class FaultProxy:
    def __init__(
        self,
        *,
        target: tuple[str, int],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        max_connections: int = 512,
        name: str = "proxy",
    ) -> None:
        self.target = target
        self.listen = listen
        self.max_connections = max_connections
        self.name = name
        self.mode = "pass"
        self.delay = 0.0
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._flowing: asyncio.Event | None = None
        self._ready = threading.Event()
        self.accepted = 0

    # -- control (any thread) ----------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._run, name=f"faultproxy-{self.name}",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def set_mode(self, mode: str, *, delay: float | None = None) -> None:
        if mode not in ("pass", "drop", "reset"):
            raise ValueError(f"unknown mode {mode!r}")
        assert self._loop is not None, "start() first"
        asyncio.run_coroutine_threadsafe(self._set(mode, delay), self._loop).result(10)

    def drop(self) -> None:
        self.set_mode("drop")

    def reset(self) -> None:
        self.set_mode("reset")

    def delayed(self, seconds: float) -> None:
        self.set_mode("pass", delay=seconds)

    def heal(self) -> None:
        self.set_mode("pass", delay=0.0)

    @property
    def open_connections(self) -> int:
        return len(self._writers) // 2

    # -- the loop (its own thread) ---------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._open())
        self._ready.set()
        loop.run_forever()
        loop.close()

    async def _open(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._client, *self.listen, backlog=128)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        self._abort_all()

    async def _set(self, mode: str, delay: float | None) -> None:
        self.mode = mode
        if delay is not None:
            self.delay = delay
        assert self._flowing is not None
        if mode == "pass":
            self._flowing.set()
        else:
            self._flowing.clear()
        if mode == "reset":
            self._abort_all()

    def _abort_all(self) -> None:
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "reset" or len(self._writers) // 2 >= self.max_connections:
            _abort(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), timeout=5
            )
        except (OSError, TimeoutError):
            _abort(writer)
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                return_exceptions=True,
            )  # fmt: skip
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                # While dropping, the chunk read is held (one per direction) and
                # nothing more is read: the kernels' buffers fill, as on a link
                # that lost every packet, and the bytes flow again after the heal.
                await self._flowing.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except OSError:
            # A side reset (a killed process with unread bytes closes with RST, a
            # crashed server): reset the other side too, as a direct link would.
            # Before, the other side stayed open: PostgreSQL kept a killed client's
            # transaction, and its row locks, until idle_in_transaction_session_timeout
            # (60 s), and every checkout of that stock waited out its lock_timeout.
            _abort(writer)
            raise
        with contextlib.suppress(Exception):
            writer.write_eof()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a reset link or a crashed peer does."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def via(url: str, port: int) -> str:
    """`url` with its host and port replaced by the local fault proxy's."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()
