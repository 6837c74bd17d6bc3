"""The fence around core/mail.py: the upstream code it overrides is the code it was written for.

`core.mail.SMTPBackend` and its connection classes override smtplib's
`SMTP.getreply` (its reader `self.file`), `SMTP._get_socket`, `SMTP.send` and
Django's `EmailBackend.open`, `_send`, `_close_connection` and
`connection_class`, written against CPython 3.11's smtplib and Django 5.2's SMTP
backend. An upgrade that changes any of them fails here: re-read core/mail.py
against the new code, then pin the new digests.
"""

from __future__ import annotations

import hashlib
import inspect
import smtplib

from django.core.mail.backends import smtp

PINNED = {
    "smtplib.SMTP.getreply": (smtplib.SMTP.getreply, "1317a4a0bc810d4c"),
    "smtplib.SMTP._get_socket": (smtplib.SMTP._get_socket, "0bb2eea38d7b7d4d"),
    "smtplib.SMTP.send": (smtplib.SMTP.send, "9b2e0377b7cdc42a"),
    "smtplib.SMTP_SSL._get_socket": (smtplib.SMTP_SSL._get_socket, "a6bb80577db4f69c"),
    "EmailBackend.open": (smtp.EmailBackend.open, "4542d3e51cbaf6c0"),
    "EmailBackend._send": (smtp.EmailBackend._send, "0a3f2774a3b9669a"),
    "EmailBackend._close_connection": (smtp.EmailBackend._close_connection, "1ee9d94f71e691a1"),
    "EmailBackend.connection_class": (smtp.EmailBackend.connection_class, "bf9a4567d310e22a"),
}


def digest(code) -> str:
    source = inspect.getsource(code.fget if isinstance(code, property) else code)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def test_the_upstream_code_core_mail_overrides_is_unchanged():
    changed = [name for name, (code, pinned) in PINNED.items() if digest(code) != pinned]
    assert changed == [], f"re-read core/mail.py against the new upstream code of {changed}"


def test_the_fence_sees_a_change():
    def getreply(self):  # a stand-in for an upstream edit
        return None

    assert digest(getreply) != PINNED["smtplib.SMTP.getreply"][1]
