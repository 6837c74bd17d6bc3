"""The shop as the scenarios load it: a keyed order request, a simulated provider, a gunicorn.

What more than one scenario needs lives here under public names:

- `order_request(headers, sku)`: one keyed `POST /api/v1/orders/` (one line,
  `pm_card_ok`, a fresh Idempotency-Key), or the same checkout unkeyed
  (`UNKEYED`, mounted by the bench's settings) with `keyed=False`;
- `simulator(workdir)`: the simulated provider (`python -m devtools.simulator
  --port 0`) on a free port, stopped on the way out;
- `shop_with_provider(stack, ctx, prefix=...)`: a work folder, a simulator and
  a gunicorn paid through it, all stopped when `stack` closes;
- `postgres_cpu_source(ctx)`: the PostgreSQL server's CPU (its postmaster's
  process tree, bench/cpu.py); `backends_cpu_source(ctx)` only its backends
  of the bench database (what a run on a shared server can tell apart).
"""

from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from bench import cpu
from bench.dbs import PgTarget
from bench.loadgen import Request
from bench.server import ROOT, Gunicorn

ORDERS = "/api/v1/orders/"
UNKEYED = "/api/v1/_test/orders-unkeyed/"
ADDRESS = {
    "name": "Bench Shopper",
    "line1": "1 Load Street",
    "city": "Loopback",
    "postal_code": "12700",
    "country": "DE",
}


def order_request(
    token_headers: dict, sku: str, quantity: int = 1, *, keyed: bool = True
) -> Request:
    """One order of `quantity` units of `sku`, paid with `pm_card_ok`; keyed with a fresh key."""
    body = {
        "lines": [{"sku": sku, "quantity": quantity}],
        "on_shortage": "reject",
        "payment_method": "pm_card_ok",
        "shipping_address": ADDRESS,
    }
    headers = {**token_headers, "Content-Type": "application/json"}
    if not keyed:
        return Request("POST", UNKEYED, headers, json.dumps(body).encode())
    headers["Idempotency-Key"] = uuid.uuid4().hex
    return Request("POST", ORDERS, headers, json.dumps(body).encode())


def postgres_cpu_source(ctx):
    """The PostgreSQL server's CPU source (its postmaster's process tree), found from ctx."""
    target = PgTarget.from_url(ctx.server.env["DATABASE_URL"])
    return cpu.tree_source(cpu.postmaster_pid(target.maintenance_conninfo()))


def backends_cpu_source(ctx, database: PgTarget | None = None):
    """The CPU of the backends of `database` only (default: the bench database)."""
    target = database or PgTarget.from_url(ctx.server.env["DATABASE_URL"])
    return cpu.backends_source(target.maintenance_conninfo(), (target.dbname,))


@contextlib.contextmanager
def simulator(workdir: Path):
    """Run the simulated provider on a free port; yield its base URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools.simulator", "--port", "0"]
        + ["--db", str(workdir / "simulator.sqlite3")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else b""
        if not line:
            raise RuntimeError("the payment simulator did not start")
        yield f"http://127.0.0.1:{json.loads(line)['port']}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def shop_with_provider(
    stack: contextlib.ExitStack, ctx, *, prefix: str, threads: int | None = None
) -> tuple[Path, str, Gunicorn]:
    """Start a work folder, a simulator and a gunicorn using it on `stack`; return them.

    Returns (workdir, provider_url, server); everything stops when the stack
    closes. `threads` runs gunicorn as production does (the shop's worker
    class, that many request threads per worker) instead of sync workers.
    """
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    provider_url = stack.enter_context(simulator(workdir))
    server = Gunicorn(
        workers=ctx.workers,
        env={**ctx.server.env, "PAYMENTS_PROVIDER_URL": provider_url},
        log_path=workdir / "gunicorn.log",
        threads=threads,
    )
    stack.callback(server.stop)
    server.start()
    return workdir, provider_url, server
