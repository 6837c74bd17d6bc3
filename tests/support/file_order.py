"""Hand the longest test files to the xdist workers first (docs/testing.md, "Running in parallel").

`make test` runs `--dist loadfile --no-loadscope-reorder`: each file goes to
one worker, in collection order. A long file handed out last keeps one
worker busy while the others have nothing left to do, so every worker
orders its collection the same way, longest file first:

- by the seconds each file took in the last parallel run of this checkout
  (pytest's cache, key `FILE_SECONDS`, written by the controller at the end
  of the run and merged, so a run of a few files keeps the others' figures);
- else, on a fresh clone, `LONGEST` first, in its order (the files that
  start browsers, whole shops or the runner's processes), then the rest by
  their number of tests, as xdist's own reordering does.

The order within a file is kept. All workers read the same cache at start,
so their collections stay identical, which xdist checks.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest

FILE_SECONDS = "shop/file-seconds"
ROOT = Path(__file__).resolve().parents[2]

# The files that take longest, longest first: the browser modules' live shop,
# the runner's whole-process tests, the process files' servers, every route
# for every role, the money model, the docs' checks, the API fuzzing
# (docs/runs/suite.md, "The slowest tests").
LONGEST = (
    "tests/browser/test_storefront.py",
    "tests/runner/test_pytest_plugin.py",
    "tests/config/test_process_files.py",
    "tests/runner/test_hosts.py",
    "tests/security/test_route_roles.py",
    "tests/orders/test_money_model.py",
    "tests/test_docs.py",
    "tests/runner/test_manage.py",
    "tests/fuzz/test_schemathesis.py",
    "tests/runner/test_server_restarts.py",
    "tests/runner/test_supervisor.py",
    "tests/browser/test_admin.py",
    "tests/orders/test_checkout_http.py",
    "tests/payments/test_reconciliation.py",
    "tests/idempotency/test_relay.py",
)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def order_longest_first(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sort `items` by their file's expected length, longest first; stable within a file."""
    cache = getattr(config, "cache", None)
    seconds: dict[str, float] = (cache.get(FILE_SECONDS, {}) if cache is not None else {}) or {}
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[file_of(item.nodeid)] += 1
    rank = {name: index for index, name in enumerate(LONGEST)}

    def key(item: pytest.Item) -> tuple:
        name = file_of(item.nodeid)
        if seconds:
            return (0, -seconds.get(name, 0.0), name)
        if name in rank:
            return (0, rank[name], name)
        return (1, -counts[name], name)

    items.sort(key=key)


class FileSeconds:
    """The controller's record of each file's seconds (every phase of every test)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is None or not self.seconds:
            return
        known = cache.get(FILE_SECONDS, {}) or {}
        known.update({name: round(value, 1) for name, value in self.seconds.items()})
        cache.set(FILE_SECONDS, known)


def register(config: pytest.Config) -> None:
    """Record the files' seconds in an xdist controller (not in its workers, nor alone)."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not getattr(config.option, "numprocesses", None):
        return
    config.pluginmanager.register(FileSeconds(), "shop-file-seconds")
