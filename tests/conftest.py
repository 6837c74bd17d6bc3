"""Fixtures shared by the whole suite. Every test runs on a real PostgreSQL and Redis."""

from __future__ import annotations

import itertools
import os
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.cache import cache
from rest_framework.test import APIClient

from core.api_tokens import api_token_issue
from tests.support import file_order

_counter = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    file_order.register(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Split the suite into its parallel and its serial pass (docs/testing.md).

    Tests marked `serial` (and `rabbitmq`, whose queues on the one broker every worker would
    share) never run in an xdist worker; `SHOP_TEST_SERIAL_ONLY=1` selects only them, for
    `make test`'s second pass. A run without xdist and without that variable runs everything.
    An xdist worker orders its files longest first (tests/support/file_order.py).
    """
    serial_only = os.environ.get("SHOP_TEST_SERIAL_ONLY") == "1"
    in_worker = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    if not (serial_only or in_worker):
        return
    keep, drop = [], []
    for item in items:
        serial = item.get_closest_marker("serial") or item.get_closest_marker("rabbitmq")
        (keep if bool(serial) == serial_only else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if in_worker:
        file_order.order_longest_first(config, items)


@pytest.fixture(autouse=True)
def _clear_cache():
    """Keep throttle counters from leaking between tests."""
    cache.clear()
    yield


def grant(user, *names: str) -> None:
    """Give `user` these model permissions (`app_label.codename`); forget its cached ones."""
    from django.contrib.auth.models import Permission

    for name in names:
        app, codename = name.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app, codename=codename)
        )
    for cached in ("_perm_cache", "_user_perm_cache"):
        user.__dict__.pop(cached, None)


@pytest.fixture
def make_user(django_user_model):
    def make(
        *,
        staff: bool = False,
        courier: bool = False,
        username: str | None = None,
        actions: bool = False,
    ):
        """A user; `actions=True`: staff holding every staff action's permission
        (backoffice.permissions, docs/security.md "One permission map")."""
        name = username or f"user{next(_counter)}"
        user = django_user_model.objects.create_user(
            username=name,
            email=f"{name}@example.com",
            password="correct horse battery",
            is_staff=staff or actions,
        )
        if courier:
            user.groups.add(Group.objects.get_or_create(name="couriers")[0])
        if actions:
            from backoffice.permissions import staff_permissions

            grant(user, *sorted(staff_permissions()))
        return user

    return make


def _client_for(user) -> APIClient:
    client = APIClient()
    token = api_token_issue(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    client.user = user
    return client


@pytest.fixture
def api_client() -> APIClient:
    return APIClient()


@pytest.fixture
def shopper(make_user):
    return make_user()


@pytest.fixture
def shopper_client(shopper) -> APIClient:
    return _client_for(shopper)


@pytest.fixture
def staff_client(make_user) -> APIClient:
    """Staff who may take every staff action (each needs its model permission)."""
    return _client_for(make_user(actions=True))


@pytest.fixture
def client_for():
    return _client_for


@pytest.fixture
def make_product(db):
    from inventory.services import product_create

    def make(sku: str = "TEE-M", *, price: str = "19.99", stock: int = 10, name: str | None = None):
        return product_create(
            sku=sku, name=name or sku, price=Decimal(price), currency="EUR", stock=stock
        )

    return make


def assert_problem(response, status: int, code: str) -> dict:
    """Assert an RFC 9457 problem response with the given status and code; return its body."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/problem+json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert body["status"] == status
    assert body["type"].endswith(code.replace("_", "-"))
    assert body["title"] and body["detail"]
    return body


# --- Real server processes on the test database (idempotency, issue 4) ----------
# Reusable by every area: tests using them need the transactional database so
# the rows they write are visible to the servers (and the servers' to them).


@pytest.fixture
def stub_service():
    """A loopback stub HTTP service (tests.support.servers.StubService), stopped afterwards."""
    from tests.support.servers import StubService

    with StubService() as stub:
        yield stub


@pytest.fixture
def gunicorn(transactional_db, tmp_path):
    """Start real gunicorn servers: `gunicorn(workers=2, failpoints="x=exit@1", **env)`.

    Returns an `tests.support.servers.Server` (`.url`, `.log()`); every server is
    stopped at the end of the test. SHOP_FAILPOINTS_DIR is a fresh directory.
    """
    import contextlib as _contextlib

    from tests.support.servers import gunicorn_server, server_env

    with _contextlib.ExitStack() as stack:

        def start(*, workers: int = 1, failpoints: str | None = None, **env):
            extra = {"SHOP_FAILPOINTS_DIR": str(tmp_path / "failpoints"), **env}
            if failpoints:
                extra["SHOP_FAILPOINTS"] = failpoints
            return stack.enter_context(
                gunicorn_server(env=server_env(**extra), workers=workers, log_dir=tmp_path)
            )

        yield start


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path):
    """Start real celery workers: `celery_worker_process(failpoints=..., **env)` -> Server."""
    import contextlib as _contextlib

    from tests.support.servers import celery_worker, server_env

    with _contextlib.ExitStack() as stack:

        def start(*, failpoints: str | None = None, concurrency: int = 1, **env):
            extra = {"SHOP_FAILPOINTS_DIR": str(tmp_path / "failpoints"), **env}
            if failpoints:
                extra["SHOP_FAILPOINTS"] = failpoints
            return stack.enter_context(
                celery_worker(env=server_env(**extra), concurrency=concurrency, log_dir=tmp_path)
            )

        yield start


@pytest.fixture(autouse=True)
def _rings_not_paused():
    """A test that made a ring fail must not silence later tests' rings (core.due.ring's pause)."""
    from core.due import doorbell

    doorbell._rings_paused_until = 0.0
    yield
    doorbell._rings_paused_until = 0.0


@pytest.fixture(autouse=True)
def _no_request_deadline_left():
    """A streamed answer the test client never closed leaves its request's deadline on
    the test's thread (request_finished ends it; core/deadline.py): it must not cut
    the test's own database work, or the next test's, 20 s later."""
    from core.deadline import set_deadline

    set_deadline(None)
    yield
    set_deadline(None)
