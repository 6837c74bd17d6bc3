"""Profile the web's Python per keyed checkout, in one process, under the production settings.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<scratch db> \\
        .venv/bin/python -m bench.profile_checkout [--checkouts N] [--counts FILE] [--stats FILE]

The database is migrated and gets a product and 200 shoppers (tokens),
whatever it held; use a scratch database. The simulated provider runs as
production's gateway calls it (`python -m devtools.simulator --port 0`);
Django's test client sends keyed `POST /api/v1/orders/` (one line,
`pm_card_ok`, a fresh key each, the shoppers in turn so that the limits per
shopper keep their defaults) through everything production runs: its
settings (`config.settings.production`, the required variables given
stand-in values, HTTPS as behind the proxy), middleware, JSON request log,
deadline, DRF, the provider's HTTP client. Prints the CPU milliseconds per
checkout (`time.process_time`, meaningful only on an idle machine) and the
Python function calls per checkout under cProfile, the figure to compare
between two commits; `--counts` writes every function's calls per
checkout including its callees' (a `sys.setprofile` pass), `--stats` the
cProfile data (docs/performance.md, "Where the checkout's CPU goes").
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import itertools
import json
import os
import pstats
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path
from tempfile import TemporaryDirectory

from bench.shop import ADDRESS, ORDERS, simulator

SHOPPERS = 200
WARM_UP = 10


def _environment(provider_url: str) -> None:
    os.environ.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        ALLOWED_HOSTS="testserver",
        SECRET_KEY=os.environ.get("SECRET_KEY") or "profile-" + "x" * 50,
        PAYMENTS_WEBHOOK_SECRET=os.environ.get("PAYMENTS_WEBHOOK_SECRET") or "profile",
        PAYMENTS_PROVIDER_URL=provider_url,
    )
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/0")


def _checkout():
    """Seed the database; return a function that places one keyed checkout."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from inventory.services import product_create
    from shop.services import token_obtain

    call_command("migrate", verbosity=0, interactive=False)
    sku = f"PROFILE-{uuid.uuid4().hex[:8]}"
    product_create(sku=sku, name=sku, price=Decimal("9.99"), currency="EUR", stock=10**8)
    users = get_user_model().objects
    tokens = [
        token_obtain(user=users.create_user(username=f"profile-{uuid.uuid4().hex}")).key
        for _ in range(SHOPPERS)
    ]
    shoppers = itertools.cycle(tokens)
    body = json.dumps(
        {
            "lines": [{"sku": sku, "quantity": 1}],
            "on_shortage": "reject",
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        }
    )
    client = Client()

    def place() -> None:
        headers = {"Authorization": f"Token {next(shoppers)}", "Idempotency-Key": uuid.uuid4().hex}
        response = client.post(
            ORDERS, body, content_type="application/json", secure=True, headers=headers
        )
        if response.status_code != 201:
            raise RuntimeError(f"checkout answered {response.status_code}: {response.content!r}")

    return place


def _counts(place, checkouts: int) -> list[tuple[float, str]]:
    """Every function's calls per checkout, its callees' included."""
    calls: collections.Counter = collections.Counter()
    stack: list[str] = []

    def tracer(frame, event, arg):
        if event in ("call", "c_call"):
            if event == "call":
                code = frame.f_code
                stack.append(f"{code.co_filename}:{code.co_firstlineno}({code.co_name})")
            else:
                stack.append(f"~({getattr(arg, '__qualname__', arg)})")
            calls.update(set(stack))
        elif event in ("return", "c_return", "c_exception") and stack:
            stack.pop()

    sys.setprofile(tracer)
    try:
        for _ in range(checkouts):
            place()
    finally:
        sys.setprofile(None)
    return [(count / checkouts, name) for name, count in calls.most_common()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkouts", type=int, default=200)
    parser.add_argument("--counts", type=Path, help="write calls per checkout, callees included")
    parser.add_argument("--stats", type=Path, help="write the cProfile data (pstats)")
    args = parser.parse_args(argv)
    with TemporaryDirectory(prefix="profile-checkout-") as workdir:
        with simulator(Path(workdir)) as provider_url:
            _environment(provider_url)
            place = _checkout()
            for _ in range(WARM_UP):
                place()
            start = time.process_time()
            for _ in range(args.checkouts):
                place()
            cpu_ms = 1000 * (time.process_time() - start) / args.checkouts
            profile = cProfile.Profile(time.process_time)
            profile.runcall(lambda: [place() for _ in range(args.checkouts)])
            stats = pstats.Stats(profile)
            calls = stats.total_calls / args.checkouts  # type: ignore[attr-defined]
            print(f"CPU ms per checkout {cpu_ms:.2f}; Python function calls {calls:.0f}")
            if args.stats:
                stats.dump_stats(args.stats)
            if args.counts:
                rows = _counts(place, min(args.checkouts, 30))
                lines = (f"{count:10.0f} {name}" for count, name in rows[:400])
                args.counts.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
