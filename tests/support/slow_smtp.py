"""A real SMTP server on loopback that answers slowly: each reply dribbled a byte at a time.

Python's own `socketserver` (aiosmtpd is not installed), a thread per
connection. It speaks enough SMTP for `smtplib` (EHLO/HELO, MAIL, RCPT,
DATA, RSET, NOOP, QUIT) and counts a message as delivered once the client's
final "." arrives: from then on the relay has it, whatever happens to the
connection. `pace` seconds pass before each byte of every reply, so each of
the client's reads waits at most `pace` (well under its socket timeout)
while the whole conversation takes about `pace` × the bytes of its replies
(`conversation_seconds`).
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

GREETING = b"220 slow\r\n"
# The replies of one message's conversation through its final answer, in order:
# the greeting, EHLO, MAIL, RCPT, DATA's 354 and the final 250.
REPLIES = (GREETING, b"250 slow\r\n", b"250 ok\r\n", b"250 ok\r\n", b"354 go\r\n", b"250 ok\r\n")


class SlowSMTP:
    """The server's state: its pace, what it delivered, how many connections it took."""

    def __init__(self, pace: float) -> None:
        self.pace = pace
        self.delivered: list[bytes] = []
        self.connections = 0
        self.host = "127.0.0.1"
        self.port = 0
        self._lock = threading.Lock()

    def conversation_seconds(self) -> float:
        """How long one message's conversation takes at this pace (connect to final answer)."""
        return self.pace * sum(len(reply) for reply in REPLIES)

    def _connected(self) -> None:
        with self._lock:
            self.connections += 1

    def _deliver(self, body: bytes) -> None:
        with self._lock:
            self.delivered.append(body)


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def _reply(self, text: bytes) -> None:
        for byte in text:
            time.sleep(self.server.state.pace)
            self.wfile.write(bytes([byte]))
            self.wfile.flush()

    def handle(self) -> None:
        state = self.server.state
        state._connected()
        try:
            self._reply(GREETING)
            while line := self.rfile.readline():
                verb = line[:4].upper()
                if verb in (b"EHLO", b"HELO"):
                    self._reply(b"250 slow\r\n")
                elif verb in (b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                    self._reply(b"250 ok\r\n")
                elif verb == b"DATA":
                    self._reply(b"354 go\r\n")
                    body = []
                    while (data := self.rfile.readline()) != b".\r\n":
                        if not data:
                            return  # the client went away mid-message: nothing delivered
                        body.append(data)
                    state._deliver(b"".join(body))
                    self._reply(b"250 ok\r\n")
                elif verb == b"QUIT":
                    self._reply(b"221 bye\r\n")
                    return
                else:
                    self._reply(b"500 what\r\n")
        except OSError:
            return  # the client closed the connection (its deadline, say)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    state: SlowSMTP


@contextmanager
def slow_smtp(*, pace: float) -> Iterator[SlowSMTP]:
    """Run a slow SMTP server on a free loopback port for the block."""
    state = SlowSMTP(pace)
    server = _Server(("127.0.0.1", 0), _Handler)
    server.state = state
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
