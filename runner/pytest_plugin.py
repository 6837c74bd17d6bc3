"""pytest plugin: embedded PostgreSQL and Redis for a session without DATABASE_URL / REDIS_URL.

Those set in the environment or in the checkout's `.env` are used as they are.

Loaded with `-p runner.pytest_plugin` (pyproject's addopts) so that
its first hook runs before pytest-django reads the settings: it starts the
missing servers once per session (data under `var/test`) and sets the URLs in
the environment; the test database is then created inside them as usual. The
servers stop when the session ends, also after Ctrl-C; if pytest is killed
outright, the kernel's parent-death signal stops them.

With pytest-xdist (`-n`), the controller starts the servers and its workers
inherit the URLs, so one PostgreSQL and one Redis serve the whole session.
Each worker gets a Redis database of its own (`worker_redis_url`): the
suite's cache clears and the Celery queues of the workers it starts must not
reach another worker's. pytest-django gives each worker its own test
database (`test_<name>_gw<N>`). See docs/testing.md, "Running in parallel".
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from . import load_env_file, var_dir
from .embedded.services import EmbeddedServices
from .processes import ServerBusy, run_dir_for

_services_key = pytest.StashKey[EmbeddedServices]()


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser, args) -> None:
    options = early_config.known_args_namespace
    if options.help or options.version:
        return
    # URLs in the checkout's .env count as set (the settings read it too).
    load_env_file()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        # The controller has set the URLs (its own servers or the environment's).
        os.environ["REDIS_URL"] = worker_redis_url(os.environ["REDIS_URL"], worker)
        return
    if os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL"):
        return
    root = var_dir() / "test"
    services = EmbeddedServices(root=root, durable=False)
    try:
        urls = services.start()
    except ServerBusy:
        # Another session of this checkout uses var/test: run on servers of
        # our own in a throwaway folder.
        root.parent.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="test-", dir=root.parent))
        services = EmbeddedServices(root=root, durable=False)
        early_config.add_cleanup(lambda: _remove(services))
        urls = services.start()
    early_config.add_cleanup(services.stop)
    early_config.stash[_services_key] = services
    os.environ.update(urls)


def pytest_report_header(config: pytest.Config) -> list[str]:
    services = config.stash.get(_services_key, None)
    if services is None:
        return []
    names = ", ".join(type(server).__name__ for server in services.started)
    return [f"embedded services: {names} in {services.root}"]


REDIS_DATABASES = 16


def worker_redis_url(url: str, worker: str) -> str:
    """Return `url` with the Redis database of xdist worker `worker` (`gw<N>`).

    Worker N takes the URL's database number plus N (modulo the server's 16),
    so `redis://h:6379/0` gives gw0 database 0, gw1 database 1, and so on.
    """
    index = int(worker.removeprefix("gw"))
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    return urlunsplit(parts._replace(path=f"/{(base + index) % REDIS_DATABASES}"))


def _remove(services: EmbeddedServices) -> None:
    services.stop()
    shutil.rmtree(services.root, ignore_errors=True)
    shutil.rmtree(run_dir_for(services.root), ignore_errors=True)
