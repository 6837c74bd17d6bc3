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
  whole flow again and again; orders/s are the HTTP requests answered in the
  measured window divided by the requests one checkout takes (in a steady
  closed loop every step completes at the checkout's rate, so a short window
  needs no whole checkout inside it), gunicorn CPU per order likewise;
- `oscar place order` at the same levels: baskets brought to the preview page
  first, unmeasured, then only the final POST is sent and timed (the window
  ends early if the prepared baskets run out);
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
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import requests as http

from bench import oscar_peer
from bench.loadgen import LoadResult, Request
from bench.oscar_peer import PRODUCT, Browser, run_prepare
from bench.scenarios import growth
from bench.server import Gunicorn
from bench.shop import order_request, shop_with_provider

NAME = "oscar"
DESCRIPTION = (
    "django-oscar 4.2 beside ours: its place-order POST and its whole browser checkout "
    "at 4/16 in flight, CPU per order, a hot product"
)
ORDER = 56

LEVELS = (4, 16)
HOT = "HOT"
HOT_UNITS, HOT_ATTEMPTS, HOT_CONCURRENCY = 100, 150, 16
QUICK_HOT_UNITS, QUICK_HOT_ATTEMPTS = 20, 40
PREPARE_THREADS = 8
# The second round: this many orders preloaded into both databases (quick: fewer).
FULL_ORDERS, QUICK_FULL_ORDERS = 100_000, 5_000
FULL_PREFIX, FULL_TAG = "oscar100k", " 100k"
TARGETS = {"ours_vs_oscar_place_order": 2.0, "ours_vs_oscar_checkout": 8.0}


class Meter:
    """The measured window of one run: HTTP requests and orders inside it, gunicorn's CPU.

    The window opens `warmup` seconds after the start and closes `duration`
    later, or earlier at `close()` (no work left). Whoever passes an edge
    first reads gunicorn's CPU (and the client's) there. Requests count when
    their answer arrives inside the window; an order's status and latency
    when it completes inside it.
    """

    def __init__(self, server: Gunicorn, *, warmup: float, duration: float):
        self.server = server
        self.lock = threading.Lock()
        self.opens = time.monotonic() + warmup
        self.closes = self.opens + duration
        self.cpu: dict[str, float] = {}
        self.client_cpu: dict[str, float] = {}
        self.requests = 0
        self.statuses: Counter = Counter()
        self.errors: Counter = Counter()
        self.latencies_ms: list[float] = []
        self.requests_per_order: list[int] = []

    def _inside(self) -> bool:
        # With the lock held: read the CPU at each edge passed, say whether now is inside.
        now = time.monotonic()
        for edge, at in (("start", self.opens), ("end", self.closes)):
            if now >= at and edge not in self.cpu:
                self.cpu[edge] = self.server.cpu_seconds()
                self.client_cpu[edge] = time.process_time()
        return "start" in self.cpu and "end" not in self.cpu

    @property
    def over(self) -> bool:
        with self.lock:
            self._inside()
            return "end" in self.cpu

    def answered(self, count: int = 1) -> None:
        with self.lock:
            if self._inside():
                self.requests += count

    def ordered(self, status: int, latency_s: float, requests: int) -> None:
        with self.lock:
            self.requests_per_order.append(requests)
            if self._inside():
                self.statuses[status] += 1
                self.latencies_ms.append(latency_s * 1000)

    def failed(self, exc: BaseException) -> None:
        with self.lock:
            if self._inside():
                self.errors[type(exc).__name__] += 1

    def close(self) -> None:
        with self.lock:
            self.closes = min(self.closes, time.monotonic())
            self._inside()

    def figures(self, label: str, concurrency: int) -> dict:
        """The run as the load generator reports one, in orders (see the module's docstring).

        Orders in the window are its HTTP requests divided by the requests one
        order takes: in a steady closed loop every step of the flow completes
        at the checkout's rate, so a short window needs no whole checkout
        inside it.
        """
        with self.lock:
            self.close_edges()
            elapsed = self.closes - self.opens
            per_order = (
                sum(self.requests_per_order) / len(self.requests_per_order)
                if self.requests_per_order
                else 1.0
            )
            result = LoadResult(
                label=label,
                concurrency=concurrency,
                elapsed_s=elapsed,
                statuses=self.statuses,
                errors=self.errors,
                latencies_ms=self.latencies_ms,
                expected=(302,),
                client_cpu_s=self.client_cpu["end"] - self.client_cpu["start"],
            ).as_dict()
        orders = self.requests / per_order
        return result | {
            "unit": "orders",
            "requests": round(orders, 1),
            "rps": round(orders / elapsed, 1) if elapsed > 0 else 0.0,
            "orders_completed": sum(self.statuses.values()),
            "http_requests": self.requests,
            "http_requests_per_order": round(per_order, 2),
            "server_cpu_s": round(self.cpu["end"] - self.cpu["start"], 3),
        }

    def close_edges(self) -> None:
        # With the lock held: a window never reached (no work at all) is empty, not unread.
        self.closes = min(self.closes, time.monotonic())
        self.opens = min(self.opens, self.closes)
        self._inside()
        for edge in ("start", "end"):
            self.cpu.setdefault(edge, self.server.cpu_seconds())
            self.client_cpu.setdefault(edge, time.process_time())


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


def _in_threads(concurrency: int, work: Callable[[], None]) -> None:
    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def whole_checkouts(server: Gunicorn, product: dict, *, concurrency: int, meter: Meter) -> None:
    """`concurrency` browsers, each checking out again and again until the window closes."""

    def work() -> None:
        while not meter.over:
            started = time.perf_counter()
            browser = Browser(server.base_url, meter)
            try:
                browser.to_preview(product)
                status = browser.place_order()
                if status == 302:
                    browser.thank_you()
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                meter.failed(exc)
                continue
            meter.ordered(status, time.perf_counter() - started, browser.requests)

    _in_threads(concurrency, work)


def final_posts(browsers: list[Browser], *, concurrency: int, meter: Meter | None) -> Counter:
    """Place the prepared browsers' orders, `concurrency` at a time; return the answers."""
    ready: queue.SimpleQueue[Browser] = queue.SimpleQueue()
    for browser in browsers:
        ready.put(browser)
    answers: Counter = Counter()
    lock = threading.Lock()

    def work() -> None:
        while meter is None or not meter.over:
            try:
                browser = ready.get_nowait()
            except queue.Empty:
                if meter is not None:
                    meter.close()  # out of baskets: the window ends here
                return
            browser.meter = meter
            started = time.perf_counter()
            try:
                status = browser.place_order()
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                if meter is not None:
                    meter.failed(exc)
                continue
            with lock:
                answers[status] += 1
            if meter is not None:
                meter.ordered(status, time.perf_counter() - started, 1)

    _in_threads(concurrency, work)
    return answers


# --- the scenario -------------------------------------------------------------------------


def _summary(run: dict) -> str:
    return (
        f"{run['label']} c={run['concurrency']}: {run['rps']} orders/s "
        f"({run['http_requests_per_order']} requests each), p50 {run['latency_ms']['p50']} ms, "
        f"{_cpu_ms(run)} ms gunicorn CPU per order, status {run['status']}, "
        f"errors {run['errors'] or 0}"
    )


def _cpu_ms(run: dict) -> float | None:
    return round(1000 * run["server_cpu_s"] / run["requests"], 2) if run.get("requests") else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _ratios(ours_run: dict, whole: dict, final: dict) -> dict:
    return {
        "ours_orders_per_s": ours_run["rps"],
        "oscar_place_order_orders_per_s": final["rps"],
        "oscar_checkout_orders_per_s": whole["rps"],
        "ours_vs_oscar_place_order": _ratio(ours_run["rps"], final["rps"]),
        "ours_vs_oscar_checkout": _ratio(ours_run["rps"], whole["rps"]),
        "ours_cpu_ms_per_order": _cpu_ms(ours_run),
        "oscar_place_order_cpu_ms_per_order": _cpu_ms(final),
        "oscar_checkout_cpu_ms_per_order": _cpu_ms(whole),
        "ours_vs_oscar_cpu_per_order_place_order": _ratio(_cpu_ms(ours_run), _cpu_ms(final)),
        "ours_vs_oscar_cpu_per_order_checkout": _ratio(_cpu_ms(ours_run), _cpu_ms(whole)),
    }


def _hot(python: Path, env: dict, server: Gunicorn, product: dict, quick: bool) -> dict:
    attempts = QUICK_HOT_ATTEMPTS if quick else HOT_ATTEMPTS
    browsers = _prepared(server.base_url, product, attempts)
    answers = final_posts(browsers, concurrency=HOT_CONCURRENCY, meter=None)
    stock = run_prepare(python, env, "stock", HOT)
    return {
        "attempts": attempts,
        "concurrency": HOT_CONCURRENCY,
        "placed": answers.get(302, 0),
        "refused": answers.get(303, 0),
        "other_answers": {str(k): v for k, v in answers.items() if k not in (302, 303)},
        **stock,
        "oversold_units": max(0, stock["num_allocated"] - stock["num_in_stock"]),
    }


def target_rows(
    ratios: dict, hot: dict, full_ratios: dict | None = None, full_orders: int = FULL_ORDERS
) -> list[dict]:
    rows = []
    full = f", {full_orders:,} orders in both databases"
    for key, name, by_level in (
        ("ours_vs_oscar_place_order", "ours ÷ django-oscar place-order POST, orders/s", ratios),
        ("ours_vs_oscar_checkout", "ours ÷ django-oscar whole checkout, orders/s", ratios),
        (
            "ours_vs_oscar_place_order",
            "ours ÷ django-oscar place-order POST, orders/s" + full,
            full_ratios,
        ),
        (
            "ours_vs_oscar_checkout",
            "ours ÷ django-oscar whole checkout, orders/s" + full,
            full_ratios,
        ),
    ):
        if by_level is None:
            continue
        goal = TARGETS[key]
        levels = [(level, values.get(key)) for level, values in by_level.items()]
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
    from core.api_tokens import api_tokens_of

    tokens = ctx.tokens(16)
    owners = list(api_tokens_of(tokens).values_list("user_id", flat=True))
    headers = [ctx.auth_headers(token) for token in tokens]
    skus = list(ctx.skus)
    with contextlib.ExitStack() as stack:
        hot_units = QUICK_HOT_UNITS if ctx.quick else HOT_UNITS
        peer = oscar_peer.start(
            stack, ctx, prefix="bench-oscar-", setup_args=("--hot-stock", str(hot_units))
        )
        python, env, database, oscar, products = (
            peer.python,
            peer.env,
            peer.database,
            peer.server,
            peer.products,
        )
        _, _, ours_server = shop_with_provider(stack, ctx, prefix="bench-oscar-ours-")
        shop = dataclasses.replace(ctx, base_url=ours_server.base_url, server=ours_server)
        ctx.log(f"  Oscar on {oscar.base_url} ({ctx.workers} workers); ours on {shop.base_url}")

        def ours(worker: int, seq: int) -> Request:
            return order_request(
                headers[worker % len(headers)], skus[(worker * 7919 + seq) % len(skus)]
            )

        # Warm every worker of both (imports, templates, connections) before measuring.
        warming = _prepared(oscar.base_url, products[PRODUCT], 2 * ctx.workers)
        answers = final_posts(warming, concurrency=ctx.workers, meter=None)
        if set(answers) != {302}:
            reasons = {b.refusal for b in warming if b.refusal}
            raise AssertionError(
                f"warming Oscar: the final POSTs answered {dict(answers)} {reasons}"
            )
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

        def measure(tag: str) -> tuple[list[dict], dict]:
            """Ours, Oscar's whole checkout and its final POST at every level; runs, ratios."""
            runs, ratios = [], {}
            for concurrency in ctx.concurrency_levels(LEVELS):
                ours_run = shop.load(
                    label=f"ours{tag}", concurrency=concurrency, factory=ours, expected=(201,)
                )
                meter = Meter(oscar, warmup=ctx.warmup, duration=ctx.duration)
                whole_checkouts(oscar, products[PRODUCT], concurrency=concurrency, meter=meter)
                whole = meter.figures(f"oscar checkout{tag}", concurrency)
                ctx.log(f"  {_summary(whole)}")
                # Enough baskets for the window if the final POST alone runs at a third of
                # the whole checkout's request rate (it is the costliest of its requests).
                per_s = whole["http_requests"] / whole["elapsed_s"] if whole["elapsed_s"] else 0
                count = max(3 * concurrency, round(per_s / 3 * (ctx.warmup + ctx.duration)))
                ctx.log(f"  preparing {count} Oscar baskets at the preview page ...")
                browsers = _prepared(oscar.base_url, products[PRODUCT], count)
                meter = Meter(oscar, warmup=ctx.warmup, duration=ctx.duration)
                final_posts(browsers, concurrency=concurrency, meter=meter)
                final = meter.figures(f"oscar place order{tag}", concurrency)
                ctx.log(f"  {_summary(final)}")
                runs += [ours_run, whole, final]
                for run in (whole, final):
                    if run["unexpected"] or run["errors"]:
                        raise AssertionError(
                            f"{run['label']}: {run['status']} {run['errors']}\n{oscar.log_tail()}"
                        )
                ratios[str(concurrency)] = _ratios(ours_run, whole, final)
                ctx.log(f"  c={concurrency}{tag}: {ratios[str(concurrency)]}")
            return runs, ratios

        runs, ratios = measure("")
        # The same again with FULL_ORDERS orders in both databases (issue 21, goal 3).
        full_orders = QUICK_FULL_ORDERS if ctx.quick else FULL_ORDERS
        ctx.log(f"  preloading {full_orders:,} orders into ours and into Oscar's database ...")
        full_runs: list[dict] = []
        full_ratios: dict = {}
        ours_preload: dict = {}
        oscar_preload: dict = {}
        full_error = None
        started = time.monotonic()
        try:
            ours_preload = growth.preload(
                ctx, owners, full_orders, full_orders, 0, prefix=FULL_PREFIX
            )
            ctx.log(f"  ours preloaded in {time.monotonic() - started:.1f} s")
            started = time.monotonic()
            oscar_preload = run_prepare(python, env, "orders", str(full_orders))
            ctx.log(
                f"  Oscar preloaded in {time.monotonic() - started:.1f} s: "
                f"{oscar_preload['rows_added']}; its ORM counts "
                f"{oscar_preload['orm_preloaded_orders']:,} copies, "
                f"{oscar_preload['orm_orders']:,} orders in all"
            )
            if oscar_preload["orm_preloaded_orders"] != full_orders:
                raise AssertionError(f"Oscar's preload: {oscar_preload}")
            full_runs, full_ratios = measure(FULL_TAG)
        except Exception as exc:  # noqa: BLE001 - the fresh round's figures still count
            full_error = repr(exc)
            ctx.log(f"  the {full_orders:,}-order round FAILED: {full_error}")
        finally:
            # Later scenarios (relay, growth: its "fresh") find our database as it was.
            growth.unload(ctx, full_orders, prefix=FULL_PREFIX)
        runs += full_runs
        hot = _hot(python, env, oscar, products[HOT], ctx.quick)
        ctx.log(f"  Oscar hot product: {hot}")
        oscar.stop()
    return {
        "runs": runs,
        "ratios": ratios,
        "ratios_full": full_ratios,
        "full": {
            "orders_preloaded_in_each": full_orders,
            "ours_rows_added": ours_preload,
            "oscar": oscar_preload,
            "error": full_error,
            "note": "ours: copies of one confirmed order with its line, reservation, payment, "
            "events, transactions and a finished request key each (bench/scenarios/growth.py, "
            "removed again after the runs); Oscar: copies of its last placed order with every "
            "row hanging from it (bench/oscar/prepare.py orders)",
        },
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
        "target_rows": target_rows(ratios, hot, full_ratios, full_orders),
    }
