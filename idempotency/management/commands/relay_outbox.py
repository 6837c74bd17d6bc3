"""`manage.py relay_outbox`: the long-running outbox relay (one line of the run command's table).

Loops: relay one batch (claim, write deliveries, publish, mark); sleep
OUTBOX_RELAY_POLL when the outbox had less than a batch; every
OUTBOX_DELIVERY_SWEEP_SECONDS publish again the overdue deliveries. A database
or broker failure is logged and retried with backoff; SIGTERM/SIGINT stop it
between batches. Several may run at once (SKIP LOCKED claims).
"""

from __future__ import annotations

import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections, connection

from core.due import backoff, default_owner
from idempotency.messaging import relay


class Command(BaseCommand):
    help = "Relay the transactional outbox to the broker until stopped."

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=None)
        parser.add_argument("--once", action="store_true", help="relay until empty, then exit")
        parser.add_argument("--owner", default=None, help="lease owner name (default host:pid)")

    def handle(self, *args, batch=None, once=False, owner=None, **options):
        stop = {"now": False}

        def _stop(signum, frame):
            stop["now"] = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        owner = owner or f"relay:{default_owner()}"
        limit = batch or settings.OUTBOX_RELAY_BATCH
        failures = 0
        last_sweep = 0.0
        self.stdout.write(f"relay {owner} started (batch {limit})")
        self.stdout.flush()
        while not stop["now"]:
            try:
                done = relay.relay_once(limit=limit, owner=owner)
                now = time.monotonic()
                if now - last_sweep >= settings.OUTBOX_DELIVERY_SWEEP_SECONDS:
                    relay.deliveries_sweep(owner=f"sweep:{owner}")
                    last_sweep = now
                failures = 0
            except Exception as exc:  # noqa: BLE001 - the relay lives on; rows are the truth
                failures += 1
                self.stderr.write(f"relay: {type(exc).__name__}: {exc}")
                if not connection.in_atomic_block:
                    connection.close()
                time.sleep(backoff(failures, base=0.2, cap=5.0))
                continue
            if done < limit:
                if once:
                    break
                time.sleep(settings.OUTBOX_RELAY_POLL)
                close_old_connections()
        self.stdout.write(f"relay {owner} stopped")
