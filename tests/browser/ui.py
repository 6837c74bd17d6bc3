"""Helpers of the browser tests: the live shop, UI steps, screenshots, axe-core.

- `live_shop_running(dir, **env)`: the payment simulator, a real gunicorn on
  the test database and (optionally) a Celery worker with an embedded beat.
- `signup` / `login` (the storefront's forms), `staff_login` (Django's admin
  login form): every step through the UI, controls found by the contract's
  accessible names (docs/storefront.md, the contract's "Storefront").
- `check_page(page, name)`: screenshots at desktop (1280x900) and phone
  (390x844) width into `var/screenshots/<name>-desktop.png` / `-phone.png`,
  then axe-core (vendored in tests/browser/vendor/) on the page: any serious
  or critical violation fails, printed one per line with its elements.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tests.support.servers import celery_worker, gunicorn_server, server_env

ROOT = Path(__file__).resolve().parents[2]
VENDOR = Path(__file__).resolve().parent / "vendor"
AXE_JS = VENDOR / "axe.min.js"
SCREENSHOTS = ROOT / "var" / "screenshots"
CHROMIUM = os.environ.get("SHOP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
PASSWORD = "correct horse battery staple 42"
BLOCKING_IMPACTS = ("serious", "critical")

_names = itertools.count(1)


# --- The shop under test -------------------------------------------------------


@dataclass
class LiveShop:
    """The processes a browser test talks to."""

    url: str
    simulator: object
    server: object
    worker: object | None = None
    log_dir: Path | None = None
    extra: dict = field(default_factory=dict)

    def charges(self, order_number: int | str) -> list[dict]:
        """Succeeded captures at the provider for the order `order_number` (the money moved)."""
        reference = f"order-{order_number}"
        return [
            op
            for op in self.simulator.ledger()
            if op.get("reference") == reference
            and op["kind"] == "capture"
            and op["status"] == "succeeded"
        ]

    def logs(self) -> str:
        parts = [f"--- gunicorn ---\n{self.server.log()}"]
        if self.worker is not None:
            parts.append(f"--- celery ---\n{self.worker.log()}")
        return "\n".join(parts)


def shop_env(simulator, **extra) -> dict[str, str]:
    return server_env(
        PAYMENTS_PROVIDER_URL=simulator.url,
        # A lost answer (pm_card_timeout) turns into payment_pending quickly.
        PAYMENTS_PROVIDER_TIMEOUT="2",
        PAYMENTS_SETTLE_FIRST_DELAY="1",
        PAYMENTS_SWEEP_INTERVAL="1",
        ORDER_EXPIRY_SWEEP_SECONDS="1",
        DB_POOL_MAX="2",
        **extra,
    )


@contextlib.contextmanager
def live_shop_running(
    log_dir: Path, *, worker: bool = True, workers: int = 2, **env: str
) -> Iterator[LiveShop]:
    """Start the simulator, gunicorn (and a worker with beat) on the test database."""
    from tests.support.simulator import Simulator

    log_dir.mkdir(parents=True, exist_ok=True)
    simulator = Simulator(log_dir).start()
    try:
        with contextlib.ExitStack() as stack:
            environment = shop_env(simulator, **env)
            server = stack.enter_context(
                gunicorn_server(env=environment, workers=workers, log_dir=log_dir)
            )
            celery = None
            if worker:
                celery = stack.enter_context(
                    celery_worker(
                        env=environment,
                        log_dir=log_dir,
                        extra_args=("--beat", "--schedule", str(log_dir / "beat-schedule")),
                    )
                )
            yield LiveShop(
                url=server.url, simulator=simulator, server=server, worker=celery, log_dir=log_dir
            )
    finally:
        simulator.stop()


# --- Shoppers and staff through the UI ----------------------------------------


def unique_name(prefix: str = "shopper") -> str:
    return f"{prefix}{os.getpid()}x{next(_names)}"


def fill_field(locator, value: str) -> None:
    """Fill a text field or choose in a select (by value, else by visible label)."""
    tag = locator.evaluate("el => el.tagName.toLowerCase()")
    if tag == "select":
        values = locator.evaluate("el => Array.from(el.options, o => o.value)")
        if value in values:
            locator.select_option(value=value)
        else:
            locator.select_option(label=value)
    else:
        locator.fill(value)


def visit(page, path: str):
    """Open `path` and fail unless the shop answered it (status below 400)."""
    response = page.goto(path)
    assert response is not None, f"no response for {path}"
    assert response.status < 400, (
        f"GET {path} answered {response.status}:\n{page.locator('body').inner_text()[:1000]}"
    )
    return response


def double_click_keyed(page, button, *, done: re.Pattern) -> None:
    """Double-click a keyed admin form's `button` and wait for its outcome page (URL `done`).

    Chromium may send both submits of a double click. The second meets the
    first either finished (a replay: the outcome page with the first's
    message) or still running (the 409 page "being submitted already"),
    which the person reloads, as it says, until the first has finished
    (docs/admin.md): the same POST, answered as a replay.
    """
    from idempotency.views import FORM_REFUSALS

    in_use = page.get_by_text(str(FORM_REFUSALS["idempotency_key_in_use"]))
    button.dblclick()
    deadline = time.monotonic() + 30
    while not done.search(page.url):
        assert time.monotonic() < deadline, f"still on {page.url} after a double click"
        page.wait_for_timeout(200)
        if in_use.count():
            page.reload()
    page.wait_for_load_state()


def _field(page, name: str):
    return page.get_by_label(name, exact=True)


def signup(page, username: str | None = None, *, password: str = PASSWORD) -> str:
    """Create a shopper with the sign-up form; leave them logged in. Returns the username."""
    username = username or unique_name()
    visit(page, "/accounts/signup/")
    _field(page, "Username").fill(username)
    _field(page, "Email").fill(f"{username}@example.com")
    _field(page, "Password").fill(password)
    page.get_by_role("button", name="Sign up").click()
    page.wait_for_load_state()
    if not page.get_by_role("button", name="Log out", exact=True).count():
        # The sign-up page may send a new shopper to the login form instead.
        login(page, username, password=password)
    return username


def login(page, username: str, *, password: str = PASSWORD) -> None:
    visit(page, "/accounts/login/")
    _field(page, "Username").fill(username)
    _field(page, "Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()
    assert page.get_by_role("button", name="Log out", exact=True).count(), (
        f"not logged in after the login form: {page.url}"
    )


def staff_login(page, username: str, *, password: str) -> None:
    """Log in to Django's admin with its own form."""
    visit(page, "/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r"/admin/$"))


# --- Screenshots and the accessibility check ----------------------------------


def format_violations(violations: list[dict]) -> str:
    lines = []
    for violation in violations:
        lines.append(
            f"[{violation['impact']}] {violation['id']}: {violation['help']}"
            f" ({violation.get('helpUrl', '')})"
        )
        for node in violation.get("nodes", [])[:10]:
            target = " ".join(json.dumps(t) for t in node.get("target", []))
            summary = (node.get("failureSummary") or "").replace("\n", " / ")
            lines.append(f"    at {target}: {summary}")
            html = (node.get("html") or "")[:200]
            if html:
                lines.append(f"       {html}")
    return "\n".join(lines)


def axe_violations(page) -> list[dict]:
    """Run the vendored axe-core on the page; return its violations (all impacts)."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE_JS))
    return page.evaluate(
        """async () => {
            const result = await axe.run(document, {resultTypes: ['violations']});
            return result.violations.map(v => ({
                id: v.id, impact: v.impact, help: v.help, helpUrl: v.helpUrl,
                nodes: v.nodes.map(n => ({target: n.target, html: n.html,
                                          failureSummary: n.failureSummary})),
            }));
        }"""
    )


def assert_accessible(page, name: str) -> None:
    blocking = [v for v in axe_violations(page) if v.get("impact") in BLOCKING_IMPACTS]
    assert not blocking, (
        f"axe-core: serious or critical violations on {name} ({page.url}):\n"
        + format_violations(blocking)
    )


def screenshot(page, name: str) -> list[Path]:
    """Full-page screenshots at desktop and phone width; the viewport is restored."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    original = page.viewport_size or DESKTOP
    paths = []
    try:
        for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
            page.set_viewport_size(size)
            path = SCREENSHOTS / f"{name}-{label}.png"
            page.screenshot(path=str(path), full_page=True)
            paths.append(path)
    finally:
        page.set_viewport_size(original)
    return paths


def check_page(page, name: str, *, axe: bool = True) -> None:
    """Screenshots of the current page at both widths, then the axe check."""
    screenshot(page, name)
    if axe:
        assert_accessible(page, name)


class RequestLog:
    """Every URL a browser context requested, to prove nothing goes to another host."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.urls: list[str] = []

    def __call__(self, request) -> None:
        self.urls.append(request.url)

    def foreign(self) -> list[str]:
        return [
            url
            for url in self.urls
            if urlsplit(url).scheme not in ("data", "blob", "about")
            and origin_of(url) != self.origin
        ]


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
