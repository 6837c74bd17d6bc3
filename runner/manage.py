"""`manage.py` from the checkout on the same servers as the shop (docs/running.md).

A URL set in the environment (or the checkout's `.env`) is used as it is.
For each one that is not: while `make run` is up, the embedded server it
published in its runtime folder; otherwise the embedded server of `var/`,
started for this command and stopped when the command ends (nothing keeps
running behind the user's back, and the next `make run` finds the servers
free). `dbshell` gets the embedded PostgreSQL's own `psql`. The commands that
reach no server (`SERVERLESS_COMMANDS`: `make messages`) start nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import psutil

from . import load_env_file, var_dir
from .processes import ServerBusy, process_matches, run_dir_for

NAMES = ("DATABASE_URL", "REDIS_URL")
PUBLISHED = "services.json"  # in the runtime folder, written by the run command
# Commands that reach no server: the translation catalogues (`make messages`) and
# Django's help; they run without starting anything.
SERVERLESS_COMMANDS = frozenset(
    {"makemessages", "compilemessages", "help", "version", "--help", "-h", "--version"}
)


def needs_servers(argv: Sequence[str]) -> bool:
    """Whether the management command of `argv` (manage.py's) reaches a server."""
    command = argv[1] if len(argv) > 1 else "help"
    return command not in SERVERLESS_COMMANDS


def publish(run_dir: Path, urls: Mapping[str, str]) -> Path:
    """Record the URLs of the run command's embedded servers for `manage.py` to find."""
    path = run_dir / PUBLISHED
    tmp = path.with_suffix(".tmp")
    state = {"pid": os.getpid(), "create_time": psutil.Process().create_time(), "urls": dict(urls)}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(state, file)
    tmp.replace(path)
    return path


def published(run_dir: Path) -> dict[str, str] | None:
    """Return the URLs a live run command published for this data folder, else None."""
    try:
        state = json.loads((run_dir / PUBLISHED).read_text())
        pid, created, urls = state["pid"], state["create_time"], state["urls"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # A killed run leaves its file behind; its pid may since name another process.
    if not process_matches(pid, create_time=created):
        return None
    return dict(urls)


def _say(message: str) -> None:
    print(f"manage.py: {message}", file=sys.stderr, flush=True)


def _put_psql_on_path() -> None:
    # The embedded server's own client: present on a machine without any
    # PostgreSQL installed, and of the server's version on one with another.
    from .embedded.postgres import bin_dir

    os.environ["PATH"] = f"{bin_dir()}{os.pathsep}{os.environ.get('PATH', '')}"


@contextlib.contextmanager
def servers_for_command(argv: Sequence[str] = ()) -> Iterator[None]:
    """Set DATABASE_URL / REDIS_URL for a management command, embedding what is missing.

    `argv` is manage.py's: a command that reaches no server (`needs_servers`)
    starts nothing.
    """
    load_env_file()
    missing = [name for name in NAMES if not os.environ.get(name)]
    if not missing or (argv and not needs_servers(argv)):
        yield
        return
    var = var_dir()
    run_urls = published(run_dir_for(var))
    if run_urls is not None:
        lacking = [name for name in missing if name not in run_urls]
        if lacking:
            raise SystemExit(
                f"manage.py: `make run` takes {' and '.join(lacking)} from its environment "
                "(nothing embedded); set the same here or in .env"
            )
        os.environ.update({name: run_urls[name] for name in missing})
        if "DATABASE_URL" in missing:
            _put_psql_on_path()
        yield
        return

    from .embedded.services import EmbeddedServices

    services = EmbeddedServices(root=var, durable=True)
    try:
        urls = services.start()
    except ServerBusy as exc:
        raise SystemExit(
            f"manage.py: {exc} (another manage.py command, or `make run` starting or "
            "stopping); try again when it ends"
        ) from None
    try:
        names = " and ".join(server.name for server in services.started)
        _say(f"started the embedded {names} of {var} for this command; stopped when it ends")
        os.environ.update(urls)
        if "DATABASE_URL" in urls:
            _put_psql_on_path()
        yield
    finally:
        services.stop()
