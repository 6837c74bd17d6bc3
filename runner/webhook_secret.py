"""The provider's webhook secret for `make run` (PAYMENTS_WEBHOOK_SECRET).

Production settings require the variable. In development, when it is not
set, the run command generates one secret per install, keeps it in
`var/webhook-secret` (mode 0600, reused by every later start) and gives it
to the web processes and to the payment simulator, which signs with it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import MutableMapping
from pathlib import Path

FILE_NAME = "webhook-secret"
WEBHOOK_PATH = "/api/v1/payments/webhooks/"


def webhook_secret(var: Path, environ: MutableMapping[str, str]) -> tuple[str, str]:
    """Return (secret, where it came from: "environment" | "generated" | "kept")."""
    configured = environ.get("PAYMENTS_WEBHOOK_SECRET")
    if configured:
        return configured, "environment"
    path = Path(var) / FILE_NAME
    try:
        kept = path.read_text().strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept, "kept"
    secret = "whsec_" + secrets.token_hex(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Create it private and atomically: a concurrent start keeps the first one.
    tmp = path.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        secret = path.read_text().strip()
    finally:
        tmp.unlink(missing_ok=True)
    return secret, "generated"


def webhook_env(*, var: Path, environ: MutableMapping[str, str], host: str, port: str) -> str:
    """Put the secret and the webhook URL into `environ` (for every child); return the line
    to print at start (`webhook secret: <value>`)."""
    secret, source = webhook_secret(var, environ)
    environ["PAYMENTS_WEBHOOK_SECRET"] = secret
    environ.setdefault("SIMULATOR_WEBHOOK_SECRET", secret)
    web_host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in web_host and not web_host.startswith("["):
        web_host = f"[{web_host}]"
    environ.setdefault("SIMULATOR_WEBHOOK_URL", f"http://{web_host}:{port}{WEBHOOK_PATH}")
    if source == "environment":
        return "webhook secret: (from PAYMENTS_WEBHOOK_SECRET)"
    return f"webhook secret: {secret}"
