"""Run the simulated provider: `python -m devtools.simulator --port P --db PATH`.

Prints one JSON line `{"event": "listening", "port": ..., "control_port": ...,
"pid": ...}` once both sockets listen (`--port 0` picks a free port), then
serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading

from .server import Simulator


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.simulator", description=__doc__)
    parser.add_argument("--port", type=int, required=True, help="API port (0: any free port)")
    parser.add_argument("--db", required=True, help="SQLite ledger file (created if missing)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--control-port", type=int, default=0, help="control API port")
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=120.0,
        help="longest time a lost answer (pm_card_timeout) keeps its connection open",
    )
    parser.add_argument("--webhook-url", default=os.environ.get("SIMULATOR_WEBHOOK_URL"))
    parser.add_argument("--webhook-secret", default=os.environ.get("SIMULATOR_WEBHOOK_SECRET"))
    parser.add_argument(
        "--webhook-duplicate-rate",
        type=float,
        default=float(os.environ.get("SIMULATOR_WEBHOOK_DUPLICATE_RATE", "0.1")),
        help="share of events sent twice (at least once, like a real provider)",
    )
    parser.add_argument(
        "--webhook-max-delay-ms",
        type=int,
        default=int(os.environ.get("SIMULATOR_WEBHOOK_MAX_DELAY_MS", "1000")),
        help="each send waits a random 0..N ms first (late, out of order)",
    )
    parser.add_argument("--webhook-timeout", type=float, default=5.0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    simulator = Simulator(
        db_path=args.db,
        host=args.host,
        hold_seconds=args.hold_seconds,
        webhook_url=args.webhook_url,
        webhook_secret=args.webhook_secret,
        webhook_duplicate_rate=args.webhook_duplicate_rate,
        webhook_max_delay_ms=args.webhook_max_delay_ms,
        webhook_timeout=args.webhook_timeout,
    )
    simulator.start(port=args.port, control_port=args.control_port)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print(
        json.dumps(
            {
                "event": "listening",
                "port": simulator.api_port,
                "control_port": simulator.control_port,
                "pid": os.getpid(),
            }
        ),
        flush=True,
    )
    while not done.wait(0.5):
        pass
    simulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
