"""SMTP with a total deadline on each send: a slow, live mail server cannot outlast a lease.

`EMAIL_TIMEOUT` bounds each socket operation (a connect, a write, one read),
not a send: a relay that answers a byte at a time, each within the timeout,
keeps a send going for as long as it likes. A mail row's attempt lease
(`shop.models.Mail.due_policy`) must cover the whole send, or the sweeper
begins a second attempt while the first still sends, and the shopper gets
two e-mails without any crash (docs/events.md, "Shopper e-mails").

`SMTPBackend` is Django's SMTP backend whose every socket operation is
bounded by what is left of a total deadline (`EMAIL_SEND_DEADLINE`, from
`EMAIL_URL`'s `?deadline=`): each read and write gets `min(EMAIL_TIMEOUT,
time left)`, and once the deadline has passed the connection is closed and
the send raises `SendDeadlinePassed` (an `SMTPServerDisconnected`: the
conversation's state is unknown, so the connection is never used again).
Opening a connection and each message are bounded on their own; a caller
that holds a lease for both (`shop.emails.mails_send`) bounds them together
with `send_deadline(connection)`. The deadline is a duration measured on this
host's monotonic clock, where it is spent.

It overrides internals of CPython 3.11's smtplib (`SMTP.getreply`'s reader,
`_get_socket`, `send`) and of Django 5.2's SMTP backend (`open`, `_send`,
`_close_connection`, `connection_class`), because neither offers a total
bound on a conversation; tests/core/test_mail_fence.py pins that upstream
code and fails when an upgrade changes it.
"""

from __future__ import annotations

import smtplib
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from django.conf import settings
from django.core.mail.backends import smtp

# Seconds left of the deadline, or None when no deadline is running.
Remaining = Callable[[], float | None]


class SendDeadlinePassed(smtplib.SMTPServerDisconnected):
    """The send's total deadline passed: the connection was closed mid-conversation."""


class _DeadlineReader:
    """The reply reader smtplib reads lines from: each `recv` bounded by the time left.

    smtplib reads replies through `sock.makefile()`, whose `readline` calls
    `recv` as often as the server dribbles bytes, each with the socket's
    timeout afresh; this reader sets the timeout before every `recv`.
    """

    def __init__(self, sock: socket.socket, timeout: Callable[[], float | None]) -> None:
        self._sock = sock
        self._timeout = timeout
        self._buffer = b""

    def readline(self, limit: int = -1) -> bytes:
        while b"\n" not in self._buffer and (limit < 0 or len(self._buffer) < limit):
            self._sock.settimeout(self._timeout())
            try:
                chunk = self._sock.recv(4096)
            except TimeoutError:
                self._timeout()  # SendDeadlinePassed when it was the deadline that ran out
                raise
            if not chunk:
                break
            self._buffer += chunk
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        if limit >= 0:
            end = min(end, limit)
        line, self._buffer = self._buffer[:end], self._buffer[end:]
        return line

    def close(self) -> None:
        self._buffer = b""


class _DeadlineMixin:
    """smtplib's SMTP with every socket operation bounded by `remaining()` (and its timeout)."""

    sock: Any
    file: Any
    timeout: Any

    def __init__(self, *args: Any, remaining: Remaining, **kwargs: Any) -> None:
        self._remaining = remaining  # before super().__init__, which connects
        super().__init__(*args, **kwargs)

    def _op_timeout(self) -> float | None:
        """The next socket operation's timeout; closed and SendDeadlinePassed once it passed."""
        left = self._remaining()
        if left is None:
            return self.timeout
        if left <= 0:
            self.close()  # type: ignore[attr-defined]
            raise SendDeadlinePassed("the send's total deadline passed")
        return left if self.timeout is None else min(float(self.timeout), left)

    def _get_socket(self, host, port, timeout):
        return super()._get_socket(host, port, self._op_timeout())  # type: ignore[misc]

    def send(self, s) -> None:
        if self.sock is not None:
            self.sock.settimeout(self._op_timeout())
        try:
            super().send(s)  # type: ignore[misc]
        except smtplib.SMTPServerDisconnected:
            left = self._remaining()
            if left is not None and left <= 0:
                raise SendDeadlinePassed("the send's total deadline passed") from None
            raise

    def getreply(self):
        if self.file is None and self.sock is not None:
            self.file = _DeadlineReader(self.sock, self._op_timeout)
        return super().getreply()  # type: ignore[misc]


class _SMTP(_DeadlineMixin, smtplib.SMTP):
    pass


class _SMTP_SSL(_DeadlineMixin, smtplib.SMTP_SSL):  # noqa: N801 - smtplib's name
    pass


class SMTPBackend(smtp.EmailBackend):
    """Django's SMTP backend; opening a connection and each message end within the deadline.

    `send_deadline` (seconds; default `EMAIL_SEND_DEADLINE`) bounds each
    `open()` and each message's send in total; `deadline()` bounds a block
    of them together (nested: the tighter one holds). Closing sends QUIT
    within the same bound and, past it, closes the socket.
    """

    def __init__(self, *args: Any, send_deadline: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.send_deadline = float(
            settings.EMAIL_SEND_DEADLINE if send_deadline is None else send_deadline
        )
        self._deadline: float | None = None  # time.monotonic() when the running bound ends

    @contextmanager
    def deadline(self, seconds: float | None = None) -> Iterator[None]:
        """Bound every socket operation inside the block by `seconds` (default: the deadline)."""
        outer = self._deadline
        ends = time.monotonic() + (self.send_deadline if seconds is None else seconds)
        self._deadline = ends if outer is None else min(outer, ends)
        try:
            yield
        finally:
            self._deadline = outer

    def _left(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    @property
    def connection_class(self):
        base = _SMTP_SSL if self.use_ssl else _SMTP

        def connect(*args: Any, **kwargs: Any):
            return base(*args, remaining=self._left, **kwargs)

        return connect

    def open(self):
        with self.deadline():
            return super().open()

    def _send(self, email_message):
        with self.deadline():
            # django-stubs omit the backend's private helpers (_send, _close_connection).
            return super()._send(email_message)  # type: ignore[misc]

    def _close_connection(self, connection):
        with self.deadline():
            try:
                super()._close_connection(connection)  # type: ignore[misc]
            except OSError:
                connection.close()  # QUIT unanswered in time: the socket goes anyway


def send_deadline(connection) -> Any:
    """`connection.deadline()` for a connection that has one (`SMTPBackend`); else nothing.

    The console, file and in-memory backends make no network call to bound.
    """
    bound = getattr(connection, "deadline", None)
    return bound() if bound is not None else nullcontext()
