"""The chaos run's checker: `snapshot`, `wait` and `verify` (run by tools/chaos/run.py).

    python -m tools.chaos.check snapshot --run-dir RUN_DIR
        before the workload: write RUN_DIR/initial.json
    python -m tools.chaos.check wait --run-dir RUN_DIR --timeout SECONDS
        block until nothing is pending (progress every 5 s on stderr);
        exit 0 when quiet, 3 on timeout (what is pending is printed)
    python -m tools.chaos.check verify --run-dir RUN_DIR
        check every invariant, print a table, write RUN_DIR/invariants.json;
        exit 0 when none is violated, 1 otherwise

The invariants and how each is computed: docs/failure-model.md, "Chaos run:
invariants". Dev tooling: never imported by production code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EXIT_OK = 0
EXIT_VIOLATED = 1
EXIT_TIMEOUT = 3
PROGRESS_EVERY = 5.0
POLL_EVERY = 1.0


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    import django

    django.setup()


def cmd_snapshot(run_dir: Path) -> int:
    """Write RUN_DIR/initial.json: the state `verify` counts from."""
    from .invariants import RunFiles, snapshot

    files = RunFiles(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = snapshot()
    files.initial.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
    print(
        f"snapshot: {len(state['stock'])} skus, {len(state['loyalty'])} loyalty accounts, "
        f"orders up to number {state['max_order_number']} -> {files.initial}",
        file=sys.stderr,
    )
    return EXIT_OK


def _summary(pending: dict[str, list[str]]) -> str:
    busy = {kind: len(items) for kind, items in pending.items() if items}
    return ", ".join(f"{kind} {n}" for kind, n in busy.items()) or "nothing"


def cmd_wait(run_dir: Path, timeout: float, *, through_holds: bool = False) -> int:
    """Poll until nothing is pending twice in a row; 3 (and what is left) on timeout.

    `through_holds`: orders awaiting a decision are pending until they expire
    (invariants.pending_work).
    """
    from django.db import close_old_connections, connection

    from .invariants import pending_work

    start = time.monotonic()
    deadline = start + timeout
    next_progress = start
    quiet_polls = 0
    while True:
        if not connection.in_atomic_block:
            close_old_connections()  # a database restarted meanwhile: reconnect
        try:
            pending = pending_work(holds=through_holds)
        except Exception as exc:  # noqa: BLE001
            # The database or the broker is down for a moment (a kill): not quiet yet.
            pending = {"unreachable": [f"{type(exc).__name__}: {exc}"]}
            if not connection.in_atomic_block:
                connection.close()
        busy = any(pending.values())
        quiet_polls = 0 if busy else quiet_polls + 1
        now = time.monotonic()
        if quiet_polls >= 2:
            # Twice, a poll apart: a beat tick or a relay hand-off in flight is not quiet.
            print(f"wait: quiet after {now - start:.1f} s", file=sys.stderr)
            return EXIT_OK
        if now >= next_progress:
            print(f"wait: {now - start:5.1f} s, pending: {_summary(pending)}", file=sys.stderr)
            next_progress = now + PROGRESS_EVERY
        if now >= deadline:
            print(f"wait: timed out after {timeout:g} s; still pending:", file=sys.stderr)
            for kind, items in pending.items():
                for item in items[:20]:
                    print(f"  {kind}: {item}")
                if len(items) > 20:
                    print(f"  {kind}: ... {len(items) - 20} more")
            return EXIT_TIMEOUT
        time.sleep(POLL_EVERY)


def cmd_verify(run_dir: Path) -> int:
    """Check every invariant; print the table; write RUN_DIR/invariants.json."""
    from .invariants import MAX_SHOWN, RunFiles, verify

    files = RunFiles(run_dir)
    results = verify(files=files)
    ok = all(not r.violations for r in results)
    width = max(len(r.name) for r in results)
    print(f"{'invariant':<{width}}  {'checked':>8}  {'violations':>10}")
    for r in results:
        print(f"{r.name:<{width}}  {r.checked:>8}  {len(r.violations):>10}")
    for r in results:
        if r.violations:
            print(f"\n{r.name}: {len(r.violations)} violation(s)")
            for line in r.violations[:MAX_SHOWN]:
                print(f"  - {line}")
            if len(r.violations) > MAX_SHOWN:
                print(f"  ... {len(r.violations) - MAX_SHOWN} more in {files.result}")
    print(f"\n{'OK' if ok else 'VIOLATED'}: {sum(len(r.violations) for r in results)} violations")
    files.result.write_text(
        json.dumps({"invariants": [r.as_dict() for r in results], "ok": ok}, indent=2) + "\n"
    )
    return EXIT_OK if ok else EXIT_VIOLATED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chaos.check", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("snapshot", "wait", "verify"):
        sub = commands.add_parser(name)
        sub.add_argument("--run-dir", type=Path, required=True)
        if name == "wait":
            sub.add_argument("--timeout", type=float, required=True)
            sub.add_argument(
                "--through-holds",
                action="store_true",
                help="also wait for every order awaiting a decision to expire",
            )
    args = parser.parse_args(argv)
    _setup()
    if args.command == "snapshot":
        return cmd_snapshot(args.run_dir)
    if args.command == "wait":
        return cmd_wait(args.run_dir, args.timeout, through_holds=args.through_holds)
    return cmd_verify(args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
