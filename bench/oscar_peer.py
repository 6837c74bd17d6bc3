"""django-oscar 4.2, the bench's peer: its environment, its database, its gunicorn, a browser.

What both Oscar scenarios (bench/scenarios/oscar.py: closed loop beside
ours; bench/scenarios/oscar_sustained.py: its whole checkout open loop)
need, under public names:

- `ensure_venv(log)`: Oscar's own environment (`var/bench-oscar-venv`, made
  from `bench/oscar/requirements.txt` when missing or stale; never the
  shop's venv, never requirements.txt);
- `start(stack, ctx, ...)`: its database `<bench db>_oscar` on the same
  PostgreSQL server, migrated and given the fixtures of
  `bench/oscar/prepare.py` (one product class, a product with ten million
  units at one partner, free shipping, guest checkout, a payment recorded
  without a gateway), and its gunicorn with as many workers as ours; all
  undone when `stack` closes;
- `Browser`: one shopper's `requests.Session` (cookies: session, CSRF) that
  reads the CSRF token from every form it posts, as a browser does:

    GET product page, POST add to basket (→ basket page), GET checkout,
    POST guest e-mail (→ shipping address form), POST shipping address
    (→ shipping method → payment method → payment details: Oscar skips the
    first two when there is one method), GET preview, POST place order
    (→ thank-you page)
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import requests as http

from bench.dbs import PgTarget, create_database, drop_database
from bench.server import ROOT, Gunicorn

VENV = ROOT / "var" / "bench-oscar-venv"
REQUIREMENTS = ROOT / "bench" / "oscar" / "requirements.txt"
PRODUCT = "BENCH-0001"
ADDRESS = {
    "first_name": "Bench",
    "last_name": "Shopper",
    "line1": "1 Load Street",
    "line4": "Loopback",
    "postcode": "12700",
}
_CSRF = re.compile(rb'name="csrfmiddlewaretoken" value="([^"]+)"')
_ALERT = re.compile(rb'<div class="alert alert-danger">(.*?)</div>', re.S)
_guests = itertools.count(1)


class OscarUnavailable(RuntimeError):
    """Oscar's environment could not be made (no package index, a failed install)."""


def stamp() -> Path:
    """The file that says the environment holds today's requirements (as the Makefile's)."""
    digest = hashlib.sha1(REQUIREMENTS.read_bytes()).hexdigest()[:12]  # noqa: S324 - a stamp
    return VENV / f".installed-{digest}"


def venv_python() -> Path | None:
    """Return the Oscar environment's Python if it is installed from today's requirements."""
    python = VENV / "bin" / "python"
    return python if stamp().exists() and python.exists() else None


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
    stamp().touch()
    return VENV / "bin" / "python"


# --- Oscar's side: the database, the server, a browser's walk ------------------------------


def oscar_env(database: PgTarget, workdir: Path) -> dict[str, str]:
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


def run_prepare(python: Path, env: dict[str, str], *argv: str) -> dict:
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


class Counter(Protocol):
    """What counts a browser's requests (bench/scenarios/oscar.py's `Meter`)."""

    def answered(self, count: int = 1) -> None: ...


class Browser:
    """One shopper's browser: its cookies, the CSRF token of the last form it read."""

    def __init__(self, base_url: str, meter: Counter | None = None):
        self.base_url = base_url
        self.meter = meter
        self.session = http.Session()
        self.token = ""
        self.requests = 0
        self.refusal = ""  # Oscar's message when the final POST did not place the order

    def _count(self, response: http.Response) -> None:
        count = 1 + len(response.history)  # redirects followed are requests too
        self.requests += count
        if self.meter is not None:
            self.meter.answered(count)

    def _read(self, response: http.Response) -> http.Response:
        self._count(response)
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
        """Send the final POST alone (no redirect followed); return its status.

        302 is an order placed (to the thank-you page); 303 stands for Oscar's
        refusal (a redirect elsewhere: back to the basket, e.g. out of stock).
        """
        answer = self.session.post(
            self.base_url + "/checkout/preview/",
            data={"csrfmiddlewaretoken": self.token, "action": "place_order"},
            allow_redirects=False,
            timeout=60,
        )
        self._count(answer)
        if answer.status_code == 302:
            return 302 if answer.headers["Location"].endswith("/thank-you/") else 303
        # Oscar shows the preview again with its reason when placing failed.
        alert = _ALERT.search(answer.content)
        self.refusal = re.sub(rb"\s+", b" ", alert.group(1)).decode() if alert else ""
        return answer.status_code

    def thank_you(self) -> None:
        self.get("/checkout/thank-you/")


@dataclasses.dataclass
class Oscar:
    """A running Oscar: its Python, environment, database, server and products by sku."""

    python: Path
    env: dict[str, str]
    database: PgTarget
    server: Gunicorn
    products: dict[str, dict]


def start(
    stack: contextlib.ExitStack,
    ctx,
    *,
    prefix: str,
    setup_args: tuple[str, ...] = (),
    threads: int | None = None,
) -> Oscar:
    """Make Oscar's database (`<bench db>_oscar`) and start its gunicorn on `stack`.

    `setup_args` go to `bench.oscar.prepare setup` (e.g. `--hot-stock N`);
    `threads` runs gunicorn's gthread workers with that many threads each
    (bench/server.py), else sync workers.
    """
    python = ensure_venv(ctx.log)
    database = PgTarget.from_url(ctx.server.env["DATABASE_URL"]).sibling("oscar")
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    env = oscar_env(database, workdir)
    drop_database(database)
    create_database(database)
    stack.callback(drop_database, database)
    ctx.log(f"  Oscar database {database.dbname}: migrate, fixtures ...")
    products = run_prepare(python, env, "setup", *setup_args)["products"]
    server = Gunicorn(
        workers=ctx.workers,
        env=env,
        log_path=workdir / "oscar-gunicorn.log",
        app="bench.oscar.wsgi:application",
        python=str(python),
        config=str(ROOT / "bench" / "oscar" / "gunicorn.conf.py"),
        threads=threads,
    )
    stack.callback(server.stop)
    server.start()
    return Oscar(python=python, env=env, database=database, server=server, products=products)
