"""django-oscar 4.2 beside ours: its checkout driven the way a browser drives it.

Oscar runs from its own environment (`var/bench-oscar-venv`, made here from
`bench/oscar/requirements.txt` when missing or stale; never the shop's venv,
never requirements.txt), on its own database `<bench db>_oscar` on the same
PostgreSQL server, migrated and given the fixtures of `bench/oscar/prepare.py`
(one product class, a product with ten million units at one partner, free
shipping, guest checkout, a payment recorded without a gateway). Its gunicorn
has as many sync workers as ours. Our side is the keyed checkout of the
checkout scenario (`POST /api/v1/orders/` paid at the simulated provider),
measured in this scenario right beside Oscar's, at the same levels.

Each Oscar client is a `requests.Session` (cookies: session, CSRF) that reads
the CSRF token from every form it posts, as a browser does:

    GET product page, POST add to basket (→ basket page), GET checkout,
    POST guest e-mail (→ shipping address form), POST shipping address
    (→ shipping method → payment method → payment details: Oscar skips the
    first two when there is one method), GET preview, POST place order
    (→ thank-you page)

- `oscar checkout` at 4 and 16 in flight (quick: 16): each client walks the
  whole flow again and again; orders/s and gunicorn CPU per order over all
  its requests;
- `oscar place order` at the same levels: baskets brought to the preview page
  first, unmeasured, then only the final POST is sent and timed;
- `ours` at the same levels, keyed checkout with a fresh key per order;
- `hot`: HOT_ATTEMPTS baskets of a product with HOT_UNITS units, brought to
  the preview and then placed at 16 in flight; Oscar's stock record then
  says how many units were allocated beyond its stock (an observation: Oscar
  checks availability before it allocates, outside any lock).

`ratios[level]` holds ours ÷ Oscar for orders/s and for CPU per order, both
for the final POST and for the whole checkout; `target_rows` the issue's
targets read from them. Every Oscar run's `requests` counts orders (its
`http_requests` the requests they took), so CPU per request is CPU per order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import requests as http

from bench.dbs import PgTarget, create_database, drop_database
from bench.loadgen import LoadResult, Request
from bench.scenarios.checkout import _order_request, _shop_with_provider
from bench.server import ROOT, Gunicorn

NAME = "oscar"
DESCRIPTION = (
    "django-oscar 4.2 beside ours: its place-order POST and its whole browser checkout "
    "at 4/16 in flight, CPU per order, a hot product"
)
ORDER = 56

LEVELS = (4, 16)
VENV = ROOT / "var" / "bench-oscar-venv"
REQUIREMENTS = ROOT / "bench" / "oscar" / "requirements.txt"
PRODUCT, HOT = "BENCH-0001", "HOT"
# Baskets prepared per second of a place-order run: more than Oscar places
# (about 40/s on the bench machine), so its workers never wait for baskets.
PLACE_ORDERS_PER_S = 50
HOT_UNITS, HOT_ATTEMPTS, HOT_CONCURRENCY = 100, 150, 16
QUICK_HOT_UNITS, QUICK_HOT_ATTEMPTS = 20, 40
PREPARE_THREADS = 8
TARGETS = {"ours_vs_oscar_place_order": 2.0, "ours_vs_oscar_checkout": 8.0}
ADDRESS = {
    "first_name": "Bench",
    "last_name": "Shopper",
    "line1": "1 Load Street",
    "line4": "Loopback",
    "postcode": "12700",
}
_CSRF = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')
_guests = itertools.count(1)


class OscarUnavailable(RuntimeError):
    """Oscar's environment could not be made (no package index, a failed install)."""


def venv_python() -> Path | None:
    """Return the Oscar environment's Python if it is installed from today's requirements."""
    digest = hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()[:12]  # noqa: S324 - a stamp
    python = VENV / "bin" / "python"
    return python if (VENV / f".installed-{digest}").exists() and python.exists() else None


def ensure_venv(log: Callable[[str], None]) -> Path:
    """Make (or bring up to date) Oscar's environment; return its Python."""
    python = venv_python()
    if python is not None:
        return python
    log(f"  installing {REQUIREMENTS.relative_to(ROOT)} into {VENV.relative_to(ROOT)} ...")
    commands = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(VENV / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        + ["-q", "-r", str(REQUIREMENTS)],
    ]
    for argv in commands:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise OscarUnavailable(
                f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr[-2000:]}"
            )
    for old in VENV.glob(".installed-*"):
        old.unlink()
    digest = hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()[:12]  # noqa: S324 - a stamp
    (VENV / f".installed-{digest}").touch()
    return VENV / "bin" / "python"


# --- Oscar's side: the database, the server, a browser's walk ------------------------------


def _oscar_env(database: PgTarget, workdir: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DJANGO_", "DATABASE_", "VIRTUAL_ENV", "PYTHON"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="bench.oscar.settings",
        OSCAR_DATABASE_URL=database.url,
        OSCAR_VAR_DIR=str(workdir / "oscar-var"),
        LOG_LEVEL="WARNING",
        PYTHONWARNINGS="ignore",
    )
    return env


def _prepare(python: Path, env: dict[str, str], *argv: str) -> dict:
    done = subprocess.run(
        [str(python), "-m", "bench.oscar.prepare", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench.oscar.prepare {argv[0]} failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class Browser:
    """One shopper's browser: its cookies, the CSRF token of the last form it read."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self.session = http.Session()
        self.token = ""
        self.requests = 0

    def _read(self, response: http.Response) -> http.Response:
        self.requests += 1 + len(response.history)
        if response.status_code != 200:
            raise AssertionError(
                f"{response.request.method} {response.url}: {response.status_code}"
            )
        match = _CSRF.search(response.content)
        if match:
            self.token = match.group(1).decode()
        return response

    def get(self, path: str) -> http.Response:
        return self._read(self.session.get(self.base_url + path, timeout=60))

    def post(self, path: str, data: dict) -> http.Response:
        form = {"csrfmiddlewaretoken": self.token, **data}
        return self._read(self.session.post(self.base_url + path, data=form, timeout=60))

    def to_preview(self, product: dict) -> None:
        """Basket one unit of `product`, check out as a guest up to the preview page."""
        self.get(product["url"])
        self.post(f"/basket/add/{product['id']}/", {"quantity": 1})
        self.get("/checkout/")
        answer = self.post(
            "/checkout/",
            {"username": f"guest{next(_guests)}@bench.invalid", "options": "anonymous"},
        )
        if not answer.url.endswith("/checkout/shipping-address/"):
            raise AssertionError(f"guest e-mail led to {answer.url}")
        answer = self.post("/checkout/shipping-address/", ADDRESS)
        if not answer.url.endswith("/checkout/payment-details/"):
            raise AssertionError(f"shipping address led to {answer.url}")
        self.get("/checkout/preview/")

    def place_order(self) -> int:
        """Send the final POST alone (no redirect followed); return its status."""
        answer = self.session.post(
            self.base_url + "/checkout/preview/",
            data={"csrfmiddlewaretoken": self.token, "action": "place_order"},
            allow_redirects=False,
            timeout=60,
        )
        self.requests += 1
        if answer.status_code == 302 and answer.headers["Location"].endswith("/thank-you/"):
            return 302
        # Refused (e.g. out of stock: back to the basket) or an error page.
        return 303 if answer.status_code == 302 else answer.status_code

    def thank_you(self) -> None:
        self.get("/checkout/thank-you/")


def _prepared(base_url: str, product: dict, count: int) -> list[Browser]:
    """`count` browsers at the preview page, made PREPARE_THREADS at a time (not measured)."""
    browsers: list[Browser] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    remaining = iter(range(count))

    def work() -> None:
        while True:
            with lock:
                if failures or next(remaining, None) is None:
                    return
            browser = Browser(base_url)
            try:
                browser.to_preview(product)
            except Exception as exc:  # noqa: BLE001 - the first failure stops them all
                with lock:
                    failures.append(exc)
                return
            with lock:
                browsers.append(browser)

    threads = [threading.Thread(target=work) for _ in range(PREPARE_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return browsers


def _drive(
    server: Gunicorn,
    *,
    label: str,
    concurrency: int,
    job: Callable[[], tuple[int, float, int] | None],
    duration: float,
    warmup: float,
) -> dict:
    """Run `job` in `concurrency` threads, closed loop; return the run's figures.

    `job()` does one order and returns (status, latency in s, HTTP requests),
    or None when there is no work left. The measured window starts after
    `warmup` and ends after `duration` or when the first thread finds no
    work left, whichever is first; orders finished inside it count, and
    gunicorn's CPU is read at its two ends.
    """
    statuses: Counter = Counter()
    errors: Counter = Counter()
    latencies: list[float] = []
    http_requests = [0]
    lock = threading.Lock()
    started = time.monotonic()
    window = {"start": started + warmup, "end": started + warmup + duration}
    cpu = {"start": None, "end": None}
    client_cpu = {"start": 0.0, "end": 0.0}

    def mark(edge: str, now: float) -> None:
        # Called with the lock held; each edge is read once, by whoever passes it first.
        if cpu[edge] is None:
            cpu[edge] = server.cpu_seconds()
            client_cpu[edge] = time.process_time()
            if edge == "end":
                window["end"] = min(window["end"], now)

    def work() -> None:
        while True:
            now = time.monotonic()
            with lock:
                if now >= window["start"]:
                    mark("start", now)
                if now >= window["end"]:
                    mark("end", now)
                    return
            try:
                done = job()
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                with lock:
                    errors[type(exc).__name__] += 1
                continue
            finished = time.monotonic()
            with lock:
                if done is None or finished >= window["start"]:
                    mark("start", finished)
                if done is None:
                    mark("end", finished)
                    return
                if finished > window["end"]:
                    mark("end", finished)
                elif finished > window["start"]:
                    status, latency, count = done
                    statuses[status] += 1
                    latencies.append(latency * 1000)
                    http_requests[0] += count

    threads = [threading.Thread(target=work, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with lock:
        mark("start", time.monotonic())
        mark("end", time.monotonic())
    result = LoadResult(
        label=label,
        concurrency=concurrency,
        elapsed_s=max(0.0, window["end"] - window["start"]),
        statuses=statuses,
        errors=errors,
        latencies_ms=latencies,
        expected=(302,),
        client_cpu_s=client_cpu["end"] - client_cpu["start"],
        extra={
            "unit": "orders",
            "http_requests": http_requests[0],
            "server_cpu_s": round(cpu["end"] - cpu["start"], 3),
        },
    )
    return result.as_dict() | {"summary": result.summary()}


def _whole_checkout(base_url: str, product: dict) -> Callable[[], tuple[int, float, int]]:
    def job() -> tuple[int, float, int]:
        started = time.perf_counter()
        browser = Browser(base_url)
        browser.to_preview(product)
        status = browser.place_order()
        if status == 302:
            browser.thank_you()
        return status, time.perf_counter() - started, browser.requests

    return job


def _final_post(browsers: list[Browser]) -> Callable[[], tuple[int, float, int] | None]:
    ready: queue.SimpleQueue[Browser] = queue.SimpleQueue()
    for browser in browsers:
        ready.put(browser)

    def job() -> tuple[int, float, int] | None:
        try:
            browser = ready.get_nowait()
        except queue.Empty:
            return None
        started = time.perf_counter()
        status = browser.place_order()
        return status, time.perf_counter() - started, 1

    return job


# --- the scenario -------------------------------------------------------------------------


def _cpu_ms(run: dict) -> float | None:
    return round(1000 * run["server_cpu_s"] / run["requests"], 2) if run.get("requests") else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _hot(python: Path, env: dict, server: Gunicorn, product: dict, quick: bool) -> dict:
    attempts = QUICK_HOT_ATTEMPTS if quick else HOT_ATTEMPTS
    browsers = _prepared(server.base_url, product, attempts)
    answers: Counter = Counter()
    lock = threading.Lock()
    job = _final_post(browsers)

    def work() -> None:
        while (done := job()) is not None:
            with lock:
                answers[done[0]] += 1

    threads = [threading.Thread(target=work) for _ in range(HOT_CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stock = _prepare(python, env, "stock", HOT)
    return {
        "attempts": attempts,
        "concurrency": HOT_CONCURRENCY,
        "placed": answers.get(302, 0),
        "refused": answers.get(303, 0),
        "other_answers": {str(k): v for k, v in answers.items() if k not in (302, 303)},
        **stock,
        "oversold_units": max(0, stock["num_allocated"] - stock["num_in_stock"]),
    }


def _target_rows(ratios: dict, hot: dict) -> list[dict]:
    rows = []
    for key, name in (
        ("ours_vs_oscar_place_order", "ours ÷ django-oscar place-order POST, orders/s"),
        ("ours_vs_oscar_checkout", "ours ÷ django-oscar whole checkout, orders/s"),
    ):
        goal = TARGETS[key]
        levels = [(level, values.get(key)) for level, values in ratios.items()]
        measured = [(level, value) for level, value in levels if value is not None]
        rows.append(
            {
                "target": name,
                "issue": "#21",
                "value": " / ".join(f"c{level}: {value:.2f}" for level, value in measured)
                or "not measured",
                "goal": f"≥ {goal:g}",
                "met": all(value >= goal for _, value in measured) if measured else None,
            }
        )
    rows.append(
        {
            "target": "django-oscar oversold units (hot product, observation)",
            "issue": "#21",
            "value": f"{hot['oversold_units']} of {hot['num_in_stock']} "
            f"({hot['placed']} orders placed from {hot['attempts']} baskets)",
            "goal": "reported (no target)",
            "met": None,
        }
    )
    return rows


def run(ctx) -> dict:
    python = ensure_venv(ctx.log)
    database = PgTarget.from_url(ctx.server.env["DATABASE_URL"]).sibling("oscar")
    tokens = ctx.tokens(16)
    headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-oscar-")))
        env = _oscar_env(database, workdir)
        drop_database(database)
        create_database(database)
        stack.callback(drop_database, database)
        ctx.log(f"  Oscar database {database.dbname}: migrate, fixtures ...")
        hot_units = QUICK_HOT_UNITS if ctx.quick else HOT_UNITS
        products = _prepare(python, env, "setup", "--hot-stock", str(hot_units))["products"]
        oscar = Gunicorn(
            workers=ctx.workers,
            env=env,
            log_path=workdir / "oscar-gunicorn.log",
            app="bench.oscar.wsgi:application",
            python=str(python),
            config=str(ROOT / "bench" / "oscar" / "gunicorn.conf.py"),
        )
        stack.callback(oscar.stop)
        oscar.start()
        _, _, ours_server = _shop_with_provider(stack, ctx, prefix="bench-oscar-ours-")
        shop = dataclasses.replace(ctx, base_url=ours_server.base_url, server=ours_server)
        ctx.log(f"  Oscar on {oscar.base_url} ({ctx.workers} workers); ours on {shop.base_url}")

        def ours(worker: int, seq: int) -> Request:
            return _order_request(
                headers[worker % len(headers)], skus[(worker * 7919 + seq) % len(skus)]
            )

        # Warm every worker of both (imports, templates, connections) before measuring.
        warm = _whole_checkout(oscar.base_url, products[PRODUCT])
        for _ in range(2 * ctx.workers):
            status = warm()[0]
            if status != 302:
                raise AssertionError(f"warming Oscar's checkout: the final POST answered {status}")
        for i in range(2 * ctx.workers):
            request = ours(i, 0)
            answer = http.post(
                shop.base_url + request.path,
                data=request.body,
                headers=dict(request.headers),
                timeout=30,
            )
            if answer.status_code != 201:
                raise AssertionError(f"warming ours answered {answer.status_code}")

        runs, ratios = [], {}
        for concurrency in ctx.concurrency_levels(LEVELS):
            ours_run = shop.load(
                label="ours", concurrency=concurrency, factory=ours, expected=(201,)
            )
            whole = _drive(
                oscar,
                label="oscar checkout",
                concurrency=concurrency,
                job=_whole_checkout(oscar.base_url, products[PRODUCT]),
                duration=ctx.duration,
                warmup=ctx.warmup,
            )
            ctx.log("  " + whole.pop("summary") + f", {whole['http_requests']} HTTP requests")
            count = max(3 * concurrency, round(PLACE_ORDERS_PER_S * (ctx.duration + ctx.warmup)))
            ctx.log(f"  preparing {count} Oscar baskets at the preview page ...")
            browsers = _prepared(oscar.base_url, products[PRODUCT], count)
            final = _drive(
                oscar,
                label="oscar place order",
                concurrency=concurrency,
                job=_final_post(browsers),
                duration=ctx.duration,
                warmup=ctx.warmup,
            )
            ctx.log("  " + final.pop("summary"))
            runs += [ours_run, whole, final]
            for run in (whole, final):
                if run["unexpected"] or run["errors"]:
                    raise AssertionError(f"{run['label']}: {run['status']} {run['errors']}")
            ratios[str(concurrency)] = {
                "ours_orders_per_s": ours_run["rps"],
                "oscar_place_order_orders_per_s": final["rps"],
                "oscar_checkout_orders_per_s": whole["rps"],
                "ours_vs_oscar_place_order": _ratio(ours_run["rps"], final["rps"]),
                "ours_vs_oscar_checkout": _ratio(ours_run["rps"], whole["rps"]),
                "ours_cpu_ms_per_order": _cpu_ms(ours_run),
                "oscar_place_order_cpu_ms_per_order": _cpu_ms(final),
                "oscar_checkout_cpu_ms_per_order": _cpu_ms(whole),
                "ours_vs_oscar_cpu_per_order_place_order": _ratio(
                    _cpu_ms(ours_run), _cpu_ms(final)
                ),
                "ours_vs_oscar_cpu_per_order_checkout": _ratio(_cpu_ms(ours_run), _cpu_ms(whole)),
            }
            ctx.log(f"  c={concurrency}: {ratios[str(concurrency)]}")
        hot = _hot(python, env, oscar, products[HOT], ctx.quick)
        ctx.log(f"  Oscar hot product: {hot}")
        oscar.stop()
    return {
        "runs": runs,
        "ratios": ratios,
        "hot": hot,
        "oscar": {
            "version": "django-oscar 4.2.1 (bench/oscar/requirements.txt)",
            "database": database.dbname,
            "workers": ctx.workers,
            "flow": "product page, add to basket, basket, checkout, guest e-mail, shipping "
            "address (shipping and payment method skipped by Oscar), payment details, "
            "preview, place order, thank-you",
        },
        "targets": dict(TARGETS),
        "target_rows": _target_rows(ratios, hot),
    }
