"""Named failpoints: make a process fail at a chosen line, for tests and the chaos run.

Inert unless the environment variable `SHOP_FAILPOINTS` is set. Its value is
`name=action[,name=action...]`; an action is

- `raise`: raise `FailpointError` (the request fails, the process lives on);
- `exit`: `os._exit(1)` at once: no cleanup, no `finally`, no commit, exactly
  like a kill;
- `sleep:<ms>`: stall for that many milliseconds (to outlive a lock TTL);
- `off`: do nothing (handy to switch one entry off without editing the rest).

An action may end with `@N`: fire only for the first N hits counted across
every process sharing `SHOP_FAILPOINTS_DIR`. Each hit tries to create
`<dir>/<name>.<i>` with O_EXCL for i in 1..N; the first successful creation
fires, so N hits fire in total whatever the number of processes, without a
lock. Without `SHOP_FAILPOINTS_DIR` the count is per process.

Example: `SHOP_FAILPOINTS="checkout.capture.after=exit@1"`.

Tests inside one process may also attach a callable to a name with `hook()`;
it runs before the configured action (used to park threads on a barrier at
an exact line).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ENV_SPEC = "SHOP_FAILPOINTS"
ENV_DIR = "SHOP_FAILPOINTS_DIR"

_ACTIONS = ("raise", "exit", "sleep", "off")


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is `raise`."""


class FailpointConfigError(ValueError):
    """Raised when `SHOP_FAILPOINTS` cannot be understood."""


@dataclass(frozen=True)
class Action:
    kind: str
    sleep_ms: int = 0
    limit: int | None = None


def parse(spec: str) -> dict[str, Action]:
    """Parse a `SHOP_FAILPOINTS` value into {name: Action}."""
    actions: dict[str, Action] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, action = entry.partition("=")
        name, action = name.strip(), action.strip()
        if not sep or not name or not action:
            raise FailpointConfigError(f"Failpoint entry {entry!r} is not name=action.")
        limit = None
        if "@" in action:
            action, _, count = action.rpartition("@")
            if not count.isdigit() or int(count) < 1:
                raise FailpointConfigError(f"Failpoint {name!r}: @N needs a positive integer.")
            limit = int(count)
        kind, _, arg = action.partition(":")
        if kind not in _ACTIONS:
            raise FailpointConfigError(f"Failpoint {name!r}: unknown action {kind!r}.")
        sleep_ms = 0
        if kind == "sleep":
            if not arg.isdigit():
                raise FailpointConfigError(f"Failpoint {name!r}: sleep needs sleep:<ms>.")
            sleep_ms = int(arg)
        elif arg:
            raise FailpointConfigError(f"Failpoint {name!r}: {kind} takes no argument.")
        actions[name] = Action(kind=kind, sleep_ms=sleep_ms, limit=limit)
    return actions


_parsed_spec: str | None = None
_parsed: dict[str, Action] = {}
_exhausted: set[tuple[str, str]] = set()
_local_hits: dict[str, int] = {}
_local_lock = threading.Lock()
_hooks: dict[str, Callable[[str], None]] = {}


def _actions_for(spec: str) -> dict[str, Action]:
    global _parsed_spec, _parsed
    if spec != _parsed_spec:
        _parsed = parse(spec)
        _parsed_spec = spec
    return _parsed


def _take_hit(name: str, limit: int) -> bool:
    """Claim one of the first `limit` hits of `name` across processes; False when used up."""
    directory = os.environ.get(ENV_DIR)
    if not directory:
        with _local_lock:
            _local_hits[name] = _local_hits.get(name, 0) + 1
            return _local_hits[name] <= limit
    marker = (directory, name)
    if marker in _exhausted:
        return False
    os.makedirs(directory, exist_ok=True)
    for i in range(1, limit + 1):
        try:
            fd = os.open(
                os.path.join(directory, f"{name}.{i}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644
            )
        except FileExistsError:
            continue
        try:
            # Who fired it, for the chaos run's judge: an exit in a web server's worker
            # is a kill of that host's server (tools/chaos/faults.py::failpoint_kills).
            os.write(
                fd, f"{os.environ.get('SHOP_HOST_NAME', '')} {os.getpid()} {sys.argv[0]}".encode()
            )
        finally:
            os.close(fd)
        return True
    _exhausted.add(marker)
    return False


def hits(name: str, directory: str | None = None) -> int:
    """Return how many counted (`@N`) hits of `name` fired so far."""
    directory = directory or os.environ.get(ENV_DIR)
    if not directory or not os.path.isdir(directory):
        return 0
    prefix = f"{name}."
    return sum(
        1 for f in os.listdir(directory) if f.startswith(prefix) and f[len(prefix) :].isdigit()
    )


def failpoint(name: str) -> None:
    """Fire the failpoint `name` if it is configured; otherwise return at once."""
    if _hooks:
        hook_fn = _hooks.get(name)
        if hook_fn is not None:
            hook_fn(name)
    spec = os.environ.get(ENV_SPEC)
    if not spec:
        return
    action = _actions_for(spec).get(name)
    if action is None or action.kind == "off":
        return
    if action.limit is not None and not _take_hit(name, action.limit):
        return
    logger.warning("failpoint %s fires: %s", name, action.kind)
    if action.kind == "raise":
        raise FailpointError(f"failpoint {name} fired")
    if action.kind == "exit":
        sys.stderr.write(f"failpoint {name}: exit\n")
        sys.stderr.flush()
        os._exit(1)
    if action.kind == "sleep":
        time.sleep(action.sleep_ms / 1000)


@contextlib.contextmanager
def hook(name: str, fn: Callable[[str], None]) -> Iterator[None]:
    """Run `fn(name)` whenever failpoint `name` is reached in this process (tests only)."""
    if name in _hooks:
        raise RuntimeError(f"failpoint {name} already has a hook")
    _hooks[name] = fn
    try:
        yield
    finally:
        _hooks.pop(name, None)
