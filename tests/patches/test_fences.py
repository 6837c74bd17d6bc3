"""Fences around the patches of third-party internals (docs/architecture.md, "Patches").

Each module of core/patches/ changes what an upstream package does inside:
it overrides or copies functions that package keeps private or may change in
any release. Here each is pinned: the upstream version the module was
written against (its docstring's `Upstream:` line names it) and a hash of
the source of every upstream function it copies, overrides or relies on. An
upgrade that moves the version or changes one of those functions fails
here, naming the package, both versions and the function; read the new
upstream function against the patch, change the patch if it must, then move
the pin (the docstring's version, this table's version and the hash printed).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

import pytest


@dataclass(frozen=True)
class Fence:
    patch: str  # the module of core/patches/
    package: str  # the upstream distribution
    version: str  # the version the patch was written against
    sources: dict[str, str]  # upstream function (dotted) -> sha256 of its source, first 16


FENCES = (
    Fence(
        "core.patches.postgresql.base",
        "Django",
        "5.2.19",
        {"django.db.backends.postgresql.base.DatabaseWrapper.pool": "e5c2654fdf2d5090"},
    ),
    Fence(
        "core.patches.postgresql.base",
        "Django",
        "5.2.19",
        {
            "django.db.backends.postgresql.base.DatabaseWrapper.get_connection_params": (
                "c3b08b880d604ccb"
            ),
            "django.db.backends.postgresql.operations.DatabaseOperations.bulk_batch_size": (
                "7d01a12e9d6e4006"
            ),
        },
    ),
    Fence(
        "core.patches.postgresql.base",
        "psycopg-pool",
        "3.3.3",
        {"psycopg_pool.ConnectionPool.getconn": "778325c161bc774e"},
    ),
    Fence(
        "core.patches.psycopg_connection",
        "psycopg",
        "3.3.9",
        {
            "psycopg.Connection.wait": "602ce5e47fca2ec9",
            "psycopg.errors._WaitTimeout": "4713e65e0ce5fcac",
        },
    ),
    Fence(
        "core.patches.celery_publish",
        "celery",
        "5.7.0",
        {"celery.app.amqp.AMQP._create_task_sender": "f648c9fd29598970"},
    ),
    Fence(
        "core.patches.celery_publish",
        "amqp",
        "5.4.2",
        {"amqp.transport._AbstractTransport.having_timeout": "740a66fab78a01ab"},
    ),
    Fence(
        "core.patches.worker_clock",
        "celery",
        "5.7.0",
        {
            "celery.worker.request.Request.eta": "38fbad8c1c0d11e5",
            "celery.worker.request.Request.__init__": "efdf47149cde3635",
        },
    ),
    Fence(
        "core.patches.celery_django",
        "celery",
        "5.7.0",
        {
            "celery.fixups.django.fixup": "c0a40688fcb27e7e",
            "celery.fixups.django.DjangoFixup.worker_fixup": "41e104b1589e0bfc",
            "celery.fixups.django.DjangoWorkerFixup.close_database": "886a5f0b2c37f5ba",
            "celery.fixups.django.DjangoWorkerFixup._close_database": "38c5a1bca1e28805",
            "celery.fixups.django.DjangoWorkerFixup.on_worker_process_init": "d5dbc73d268f03f0",
            "celery.fixups.django.DjangoWorkerFixup.on_task_prerun": "dd8adcd71a974f40",
            "celery.fixups.django.DjangoWorkerFixup.on_task_postrun": "bf5528dff9b582d2",
        },
    ),
    Fence(
        "core.patches.redis_transport",
        "kombu",
        "5.7.0",
        {
            "kombu.transport.redis.QoS.append": "35c655f6ecc62fe6",
            "kombu.transport.redis.QoS.restore_visible": "d4a4a40a3eaf9f23",
            "kombu.transport.redis.QoS.restore_unacked": "8954efef014d546e",
        },
    ),
    Fence(
        "core.patches.gunicorn_worker",
        "gunicorn",
        "27.0.1",
        {
            "gunicorn.workers.gthread.ThreadWorker.enqueue_req": "c9f428953d24acef",
            "gunicorn.workers.gthread.ThreadWorker.finish_request": "616e7bb15a009ff7",
            "gunicorn.workers.gthread.ThreadWorker.on_pending_socket_readable": "2475f7087832c086",
            "gunicorn.workers.gthread.ThreadWorker.handle": "ca85c9be3df75da4",
            "gunicorn.workers.gthread.TConn.__init__": "c8763d7c65974e1b",
        },
    ),
)


def _resolve(dotted: str) -> object:
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            target = inspect.getattr_static(target, name)
        return target.fget if isinstance(target, property) else target
    raise ImportError(dotted)


def source_hash(dotted: str) -> str:
    """The first 16 hex digits of the sha256 of the named function's (or class's) source."""
    return hashlib.sha256(inspect.getsource(_resolve(dotted)).encode()).hexdigest()[:16]


def differences(
    fence: Fence,
    *,
    version_of: Callable[[str], str] = metadata.version,
    hash_of: Callable[[str], str] = source_hash,
) -> list[str]:
    """What differs between the installed upstream and the fence's pin; [] when nothing."""
    installed = version_of(fence.package)
    found = []
    if installed != fence.version:
        found.append(
            f"{fence.package} is {installed}, {fence.patch} was written against"
            f" {fence.version}: read {', '.join(fence.sources)} in {installed} against the"
            " patch, then move the pin"
        )
    for name, pinned in fence.sources.items():
        now = hash_of(name)
        if now != pinned:
            found.append(
                f"{name} ({fence.package} {installed}) changed since {fence.version}, on which"
                f" {fence.patch} relies: its source hash is {now}, pinned {pinned}"
            )
    return found


@pytest.mark.parametrize("fence", FENCES, ids=lambda f: f"{f.patch}:{f.package}")
def test_the_installed_upstream_is_the_one_the_patch_was_written_against(fence):
    assert differences(fence) == []


@pytest.mark.parametrize("fence", FENCES, ids=lambda f: f"{f.patch}:{f.package}")
def test_the_patch_names_its_upstream_version_and_what_it_copies(fence):
    doc = inspect.getdoc(importlib.import_module(fence.patch)) or ""
    upstream = next((p for p in doc.split("\n\n") if p.startswith("Upstream:")), "")
    upstream = " ".join(upstream.split())
    assert f"{fence.package} {fence.version}" in upstream, fence.patch
    for name in fence.sources:
        *owner, last = name.split(".")
        assert (owner[-1] if last == "__init__" else last) in upstream, (fence.patch, name)


def test_every_patch_module_has_a_fence():
    from pathlib import Path

    import core.patches

    root = Path(core.patches.__file__).parent
    modules = {
        "core.patches." + ".".join(path.relative_to(root).with_suffix("").parts)
        for path in root.rglob("*.py")
        if path.name != "__init__.py"
    }
    assert modules == {fence.patch for fence in FENCES}


def test_a_fence_fails_on_another_version_or_a_changed_source():
    fence = FENCES[0]
    name = next(iter(fence.sources))
    assert differences(fence, version_of=lambda package: "99.0") == [
        f"{fence.package} is 99.0, {fence.patch} was written against {fence.version}:"
        f" read {name} in 99.0 against the patch, then move the pin"
    ]
    changed = differences(fence, hash_of=lambda dotted: "0" * 16)
    assert len(changed) == 1 and f"{name} ({fence.package} {fence.version}) changed" in changed[0]
