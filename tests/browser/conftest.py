"""Fixtures of the browser tests (helpers in tests/browser/ui.py).

- `live_shop` (one per module): the payment simulator, a real gunicorn on the
  test database pointed at it, and a real Celery worker with an embedded beat
  (settlement sweeps and reservation expiry every second); `shop` is the same
  for a test with the transactional database the servers can see.
- `browser` (one per session); `new_context(shop, **options)`, `context` and
  `page` (per test). Every context records each request it makes: a request
  to another origin than the live server's fails the test.
- `staff_user`: a superuser with a known password, for `ui.staff_login`.

Chromium is never downloaded (`playwright install` cannot reach its CDN here):
the tests use /usr/bin/chromium (override with SHOP_CHROMIUM). Without it they
skip, except in CI (CI=true), where they fail so that a broken install shows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from tests.browser.ui import (
    CHROMIUM,
    CHROMIUM_ARGS,
    DESKTOP,
    PASSWORD,
    LiveShop,
    RequestLog,
    live_shop_running,
    origin_of,
    unique_name,
)


def _unavailable(reason: str):
    """Skip on a developer's machine; fail in CI, where the browser must be there."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"browser tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"browser tests skipped: {reason}")


@pytest.fixture(scope="module")
def live_shop(django_db_setup, tmp_path_factory) -> Iterator[LiveShop]:
    """One shop (simulator + gunicorn + worker with beat) for every test of a module.

    Safe to share: each test writes its own rows (the transactional database is
    flushed between tests), and charges are counted per order reference.
    """
    with live_shop_running(tmp_path_factory.mktemp("live-shop")) as shop:
        yield shop


@pytest.fixture
def shop(browser, live_shop, transactional_db) -> LiveShop:
    """The module's live shop, for a test whose rows the servers must see."""
    return live_shop


# --- The browser ---------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Chromium for one module's tests.

    Playwright's sync API keeps an asyncio loop in this thread, which Django's
    ORM takes for an async context; the check is lifted while the browser
    runs (the tests stay synchronous) and restored afterwards, so it never
    leaks into the rest of the suite.
    """
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - depends on the machine
        _unavailable("the Python package playwright is not installed (requirements/dev.txt)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(
        CHROMIUM
    ):
        _unavailable(
            f"no Chromium at {CHROMIUM} (install Debian's package: apt-get install chromium;"
            " `playwright install` is not used)"
        )
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def new_context(browser, request):
    """`new_context(shop, **options)` -> a fresh browser context; closed after the test.

    Each one records its requests; at the end of the test any request to
    another origin than the shop's fails it.
    """
    opened: list[tuple[object, RequestLog]] = []

    def make(shop: LiveShop, **options):
        options.setdefault("viewport", DESKTOP)
        context = browser.new_context(base_url=shop.url, **options)
        context.set_default_timeout(10_000)
        context.set_default_navigation_timeout(30_000)
        log = RequestLog(origin_of(shop.url))
        context.on("request", log)
        opened.append((context, log))
        return context

    yield make
    foreign = [url for _, log in opened for url in log.foreign()]
    for context, _ in opened:
        context.close()
    assert not foreign, f"requests to another host than the live server: {foreign}"


@pytest.fixture
def context(shop, new_context):
    return new_context(shop)


@pytest.fixture
def page(context):
    return context.new_page()


@pytest.fixture
def staff_user(django_user_model):
    """A staff superuser (as `createsuperuser` makes them) with a known password."""
    name = unique_name("staff")
    user = django_user_model.objects.create_superuser(
        username=name, email=f"{name}@example.com", password=PASSWORD
    )
    user.plain_password = PASSWORD
    return user
