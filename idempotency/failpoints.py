"""Failpoints: named places where a test can make a real process fail on purpose.

Inert unless the environment variable `SHOP_FAILPOINTS` is set, e.g.

    SHOP_FAILPOINTS="payments.capture.after_provider=exit@1,checkout.after_reserve=sleep:200"

Actions: `raise` (raise `FailpointError`), `exit` (`os._exit(1)`: no cleanup, no
commit, no atexit, like a killed process), `sleep:<ms>`. The optional suffix
`@N` fires the failpoint only for its first N hits, counted across every
process that shares `SHOP_FAILPOINTS_DIR` (a file per failpoint, updated under
an exclusive `flock`); without that directory the count is per process.

This is the minimal version written by the payments area so it could test
crashes while the idempotency area builds the shared one to the same spec.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from dataclasses import dataclass

ENV_SPEC = "SHOP_FAILPOINTS"
ENV_DIR = "SHOP_FAILPOINTS_DIR"


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is `raise`."""


@dataclass(frozen=True)
class _Action:
    kind: str  # "raise" | "exit" | "sleep"
    sleep_ms: int = 0
    limit: int | None = None


_parsed: tuple[str, dict[str, _Action]] | None = None
_local_counts: dict[str, int] = {}
_local_lock = threading.Lock()


def _parse(spec: str) -> dict[str, _Action]:
    actions: dict[str, _Action] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, action = item.partition("=")
        if not sep:
            raise ValueError(f"{ENV_SPEC}: {item!r} is not name=action")
        action, _, limit_text = action.partition("@")
        limit = int(limit_text) if limit_text else None
        if action in ("raise", "exit"):
            actions[name.strip()] = _Action(kind=action, limit=limit)
        elif action.startswith("sleep:"):
            actions[name.strip()] = _Action(
                kind="sleep", sleep_ms=int(action.split(":", 1)[1]), limit=limit
            )
        else:
            raise ValueError(f"{ENV_SPEC}: unknown action {action!r} for {name!r}")
    return actions


def _actions(spec: str) -> dict[str, _Action]:
    global _parsed
    if _parsed is None or _parsed[0] != spec:
        _parsed = (spec, _parse(spec))
    return _parsed[1]


def _take_hit(name: str, limit: int) -> bool:
    """Count one hit; return True while the hit is within the first `limit`."""
    directory = os.environ.get(ENV_DIR)
    if not directory:
        with _local_lock:
            _local_counts[name] = _local_counts.get(name, 0) + 1
            return _local_counts[name] <= limit
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.count")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.read(fd, 64).strip()
        count = int(raw) + 1 if raw else 1
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(count).encode())
        os.fsync(fd)
        return count <= limit
    finally:
        os.close(fd)


def failpoint(name: str) -> None:
    """Fail here if the environment asks for it; do nothing otherwise."""
    spec = os.environ.get(ENV_SPEC)
    if not spec:
        return
    action = _actions(spec).get(name)
    if action is None:
        return
    if action.limit is not None and not _take_hit(name, action.limit):
        return
    if action.kind == "exit":
        os._exit(1)
    if action.kind == "raise":
        raise FailpointError(f"failpoint {name}")
    time.sleep(action.sleep_ms / 1000)
