"""Where mail goes, from one URL: `EMAIL_URL` (README, "Configuration").

    smtp://user:password@host:25        SMTP, no encryption (port 25 by default)
    smtp+tls://user:password@host:587   SMTP with STARTTLS (587 by default)
    smtp+ssl://user:password@host:465   SMTP over TLS (465 by default; also smtps://)
    console://                          printed to the process's standard output
    file:///absolute/folder             one file per message batch in that folder
    locmem://                           kept in memory (django.core.mail.outbox)

User and password are percent-encoded (`@` is `%40`); `?timeout=<seconds>`
bounds each socket operation of an SMTP conversation (10 s by default) and
`?deadline=<seconds>` one send in total (twice the timeout by default:
`core.mail.SMTPBackend`, docs/events.md "Shopper e-mails"). Its own module,
importable without loading any settings, so that tests can parse URLs
directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

# Django's SMTP backend with a total deadline on each send (core/mail.py).
SMTP = "core.mail.SMTPBackend"
BACKENDS = {
    "smtp": SMTP,
    "smtp+tls": SMTP,
    "smtp+ssl": SMTP,
    "smtps": SMTP,
    "console": "django.core.mail.backends.console.EmailBackend",
    "file": "django.core.mail.backends.filebased.EmailBackend",
    "locmem": "django.core.mail.backends.locmem.EmailBackend",
}
DEFAULT_PORTS = {"smtp": 25, "smtp+tls": 587, "smtp+ssl": 465, "smtps": 465}
DEFAULT_TIMEOUT = 10.0
# The separate variables EMAIL_URL replaced: one still set would be ignored
# silently (a host upgraded with EMAIL_HOST would mail localhost), so it stops the start.
REPLACED = (
    "EMAIL_BACKEND",
    "EMAIL_HOST",
    "EMAIL_PORT",
    "EMAIL_HOST_USER",
    "EMAIL_HOST_PASSWORD",
    "EMAIL_USE_TLS",
    "EMAIL_USE_SSL",
    "EMAIL_FILE_PATH",
    "EMAIL_TIMEOUT",
)


@dataclass(frozen=True)
class EmailConfig:
    """Django's EMAIL_* settings for one URL."""

    backend: str
    host: str = "localhost"
    port: int = 25
    user: str = ""
    password: str = ""
    use_tls: bool = False
    use_ssl: bool = False
    file_path: str = ""
    timeout: float = DEFAULT_TIMEOUT
    # One send in total (connect, conversation, answer): what a mail's attempt lease covers.
    deadline: float = 2 * DEFAULT_TIMEOUT


def parse(url: str) -> EmailConfig:
    """Return the settings `url` names; ValueError for a scheme or folder it cannot use."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in BACKENDS:
        raise ValueError(
            f"EMAIL_URL must start with one of {', '.join(f'{s}://' for s in BACKENDS)},"
            f" not {url.split('://')[0]}://"
        )
    if scheme == "file":
        # file:///var/mail: the folder is the path; file://var/mail is refused rather
        # than read as host "var" and folder "/mail".
        if parts.netloc or not parts.path.startswith("/"):
            raise ValueError("EMAIL_URL file:// needs an absolute folder: file:///path/to/folder")
        return EmailConfig(backend=BACKENDS[scheme], file_path=unquote(parts.path))
    if scheme not in DEFAULT_PORTS:
        return EmailConfig(backend=BACKENDS[scheme])
    query = parse_qs(parts.query)
    timeout = float(query["timeout"][0]) if "timeout" in query else DEFAULT_TIMEOUT
    deadline = float(query["deadline"][0]) if "deadline" in query else 2 * timeout
    if not (timeout > 0 and deadline > 0):
        raise ValueError("EMAIL_URL ?timeout= and ?deadline= must be positive seconds")
    return EmailConfig(
        backend=SMTP,
        host=parts.hostname or "localhost",
        port=parts.port or DEFAULT_PORTS[scheme],
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        use_tls=scheme == "smtp+tls",
        use_ssl=scheme in ("smtp+ssl", "smtps"),
        timeout=timeout,
        deadline=deadline,
    )


def replaced_variables(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The replaced EMAIL_* variables still set (in `REPLACED`'s order)."""
    return [name for name in REPLACED if name in environ]


def email_settings(default: str, environ: Mapping[str, str] = os.environ) -> dict[str, object]:
    """Django's EMAIL_* settings from EMAIL_URL (`default` when unset or empty).

    Stops the start with a message naming the problem: a replaced variable still
    set, or a URL that cannot be used.
    """
    if replaced := replaced_variables(environ):
        raise ImproperlyConfigured(
            f"{', '.join(replaced)}: replaced by EMAIL_URL (e.g. smtp+tls://user:password@host:587);"
            " unset them (README, 'Configuration')"
        )
    try:
        config = parse(environ.get("EMAIL_URL", "").strip() or default)
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from error
    return {
        "EMAIL_BACKEND": config.backend,
        "EMAIL_HOST": config.host,
        "EMAIL_PORT": config.port,
        "EMAIL_HOST_USER": config.user,
        "EMAIL_HOST_PASSWORD": config.password,
        "EMAIL_USE_TLS": config.use_tls,
        "EMAIL_USE_SSL": config.use_ssl,
        "EMAIL_FILE_PATH": config.file_path,
        "EMAIL_TIMEOUT": config.timeout,
        "EMAIL_SEND_DEADLINE": config.deadline,
    }
