"""`make bench`: reference, bench database, gunicorn, scenarios, results.

    python -m bench.run [--quick] [--scenario NAME ...] [--duration S] [--workers N]
                        [--steady-seconds S] [--sustained-rates R,R,...]
                        [--sustained-seconds S] [--oscar-sustained-rates R,R,...]
                        [--results-dir DIR] [--keep-db]
                        [--no-reference] [--list]

Steps (each printed as it happens):
1. the machine's reference: pgbench tpcb-like (8 clients) on a scratch
   database `<db>_pgbench`, and redis-benchmark unpipelined on REDIS_URL's
   Redis database;
2. a fresh bench database `<db>_bench` (migrated, catalog seeded) and gunicorn
   with sync workers on a free loopback port;
3. every selected scenario of bench/scenarios/;
4. gunicorn stopped and the reference measured again (not with --quick), so
   the noise of a shared machine shows as the spread of the two; when
   pgbench moved more than 10 % between them, every figure of the run is
   marked "noisy" (the JSON's `noisy`, the targets table, the plot). Both
   reference runs start from the same state: the bench database dropped (the
   results are in memory by then), pgbench's database initialised afresh,
   a CHECKPOINT, and a bounded wait for a quiet machine (`reference.settle`);
   each run's `conditions` in the JSON records them;
5. bench/results/<UTC timestamp>.json and .png (`-quick` appended for --quick).

`<db>` is the database name of DATABASE_URL (BENCH_DATABASE_URL overrides the
bench database). Whatever happens, gunicorn is stopped and the scratch
databases are dropped on the way out (also on Ctrl-C and SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from . import autovacuum, headline, reference, report
from .context import BenchContext
from .dbs import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    PgTarget,
    RedisTarget,
    create_database,
    drop_database,
)
from .scenarios import Scenario, discover
from .server import ROOT, Gunicorn

RESULTS_DIR = ROOT / "bench" / "results"
SEED_PRODUCTS = 200
SEED_STOCK = 1_000_000


class Bench:
    """One bench run; `main` drives it, `close` undoes everything it started."""

    def __init__(self, args: argparse.Namespace, scenarios: list[Scenario]):
        self.args = args
        self.scenarios = scenarios
        self.t0 = time.monotonic()
        # Gunicorn gets this environment plus the bench's own variables, never
        # what the harness process later sets for itself (e.g. DB_POOL=false).
        self.environ = dict(os.environ)
        self.started = datetime.now(UTC)
        base = PgTarget.from_url(os.environ.get("DATABASE_URL") or DEFAULT_DATABASE_URL)
        bench_url = os.environ.get("BENCH_DATABASE_URL")
        self.bench_db = PgTarget.from_url(bench_url) if bench_url else base.sibling("bench")
        if self.bench_db.dbname == base.dbname and bench_url is None:
            raise SystemExit("the bench database must not be DATABASE_URL's database")
        self.redis = RedisTarget.from_url(os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL)
        self.redis_url = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
        self.pgbench = reference.Pgbench(base.sibling("pgbench"))
        self.cache_prefix = f"bench{os.getpid()}"
        self.server: Gunicorn | None = None
        self.django_ready = False
        self.created: list[PgTarget] = []

    # --- progress ---------------------------------------------------------------
    def log(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    # --- reference ----------------------------------------------------------------
    def reference_under_same_conditions(self, when: str) -> dict:
        """Bring the server to the state of the first reference run, then measure.

        "after" first drops the bench database (the scenarios are done; their
        results are in memory) so its autovacuum and dirty buffers are gone.
        Both runs: pgbench's database initialised afresh (tables not bloated
        by the run before, pgbench runs with -n), a CHECKPOINT, and a wait of
        at most SETTLE_MAX_S (--quick: SETTLE_QUICK_MAX_S) for the machine to
        settle (`reference.settle`).
        """
        conditions: dict = {}
        started = time.monotonic()
        if when == "after":
            if self.django_ready:
                from django.db import connections

                connections.close_all()
            if self.args.keep_db:
                conditions["bench_database"] = "kept (--keep-db)"
            else:
                self.log(f"dropping {self.bench_db.dbname} before the reference ...")
                drop_database(self.bench_db)
                conditions["bench_database"] = "dropped"
        self.log(f"pgbench scratch database {self.pgbench.target.dbname}: initialise ...")
        self.pgbench.init()
        if self.pgbench.target not in self.created:
            self.created.append(self.pgbench.target)
        conditions["pgbench_initialised"] = True
        try:
            conditions["checkpoint_s"] = reference.checkpoint(self.pgbench.target)
        except Exception as exc:  # noqa: BLE001 - recorded; the reference still runs
            conditions["checkpoint_error"] = repr(exc)
        limit = reference.SETTLE_QUICK_MAX_S if self.args.quick else reference.SETTLE_MAX_S
        self.log(f"waiting (at most {limit:.0f} s) for the machine to settle ...")
        conditions["settle"] = reference.settle(self.pgbench.target, max_wait=limit, log=self.log)
        conditions["prepare_s"] = round(time.monotonic() - started, 1)
        self.log(
            f"  {'settled' if conditions['settle']['settled'] else 'NOT settled'} after "
            f"{conditions['settle']['waited_s']} s ({conditions['settle']['last']})"
        )
        measured = self.measure_reference(when)
        measured["conditions"] = conditions
        return measured

    def measure_reference(self, when: str) -> dict:
        quick = self.args.quick
        seconds = 3 if quick else 10
        self.log(f"reference ({when}): pgbench tpcb-like, 8 clients, {seconds} s ...")
        pg = self.pgbench.run(seconds=seconds)
        self.log(f"  pgbench: {pg['tps']:.0f} TPS, latency avg {pg['latency_avg_ms']} ms")
        requests = 20_000 if quick else 100_000
        self.log(f"reference ({when}): redis-benchmark {','.join(reference.REDIS_TESTS)} ...")
        rb = reference.redis_benchmark(self.redis, requests=requests)
        self.log(f"  redis-benchmark: {rb['ops_per_s']:.0f} ops/s {rb['per_command']}")
        return {"when": when, "loadavg": _loadavg(), "pgbench": pg, "redis": rb}

    # --- the shop ---------------------------------------------------------------------
    def prepare_database(self) -> list[str]:
        """Create, migrate and seed the bench database; return the seeded skus."""
        self.log(f"bench database {self.bench_db.dbname}: create, migrate, seed ...")
        drop_database(self.bench_db)
        create_database(self.bench_db)
        self.created.append(self.bench_db)
        # The harness needs one connection, not a pool that outlives the drop.
        os.environ.update(self._shop_env(settings="bench.settings"), DB_POOL="false")
        import django

        django.setup()
        self.django_ready = True
        from django.core.management import call_command

        from inventory.models import Product, StockItem
        from inventory.services import product_create

        call_command("migrate", verbosity=0, interactive=False)
        skus = []
        for i in range(1, SEED_PRODUCTS + 1):
            sku = f"BENCH-{i:04d}"
            product_create(
                sku=sku,
                name=f"Bench product {i}",
                price=Decimal(f"{5 + i % 50}.{i % 100:02d}"),
                currency=os.environ.get("SHOP_CURRENCY", "EUR"),
                stock=SEED_STOCK,
            )
            skus.append(sku)
        self.log(f"  {len(skus)} products, {SEED_STOCK} units each")
        # What autovacuum's analyze does after the seed: statistics for the seeded catalog,
        # so the planner keeps the generic plan of the checkout's catalog read (a server
        # with autovacuum off, as CI's, never makes them). Tables the seed leaves empty
        # stay unanalyzed: statistics of an empty table would plan scans of it for ever.
        from django.db import connection

        with connection.cursor() as cursor:
            for model in (Product, StockItem):
                cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
        return skus

    def _shop_env(self, *, settings: str) -> dict[str, str]:
        return {
            "DJANGO_SETTINGS_MODULE": settings,
            "DATABASE_URL": self.bench_db.url,
            "REDIS_URL": self.redis_url,
            "CACHE_KEY_PREFIX": self.cache_prefix,
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
            # A bench user places hundreds of orders a second: the limits per shopper
            # (docs/checkout.md) still run, but are never what a scenario measures.
            "ORDER_PLACE_PER_MINUTE": "100000000",
            "ORDER_HOLDING_MAX": "100000000",
        }

    def gunicorn_env(self) -> dict[str, str]:
        """Return gunicorn's environment: the caller's, pointed at the bench database."""
        return {**self.environ, **self._shop_env(settings="bench.gunicorn_settings")}

    def start_server(self) -> Gunicorn:
        env = self.gunicorn_env()
        stamp = self.started.strftime("%Y%m%dT%H%M%SZ")
        log_path = Path(self.args.results_dir) / f"gunicorn-{stamp}.log.tmp"
        self.server = Gunicorn(workers=self.args.workers, env=env, log_path=log_path)
        self.log(f"gunicorn: {self.args.workers} sync workers ...")
        self.server.start()
        self.log(f"  listening on {self.server.base_url}")
        return self.server

    def run_scenarios(self, skus: list[str]) -> tuple[dict, bool]:
        ctx = BenchContext(
            base_url=self.server.base_url,
            duration=self.args.duration,
            warmup=self.args.warmup,
            quick=self.args.quick,
            skus=skus,
            workers=self.args.workers,
            server=self.server,
            log=self.log,
            rss_checkouts=self.args.rss_checkouts,
            steady_seconds=self.args.steady_seconds,
            sustained_rates=self.args.sustained_rates,
            sustained_seconds=self.args.sustained_seconds,
            oscar_sustained_rates=self.args.oscar_sustained_rates,
        )
        results: dict = {}
        ok = True
        for scenario in self.scenarios:
            self.log(f"scenario {scenario.name}: {scenario.description}")
            started = time.monotonic()
            try:
                result = scenario.run(ctx)
                if not isinstance(result, dict):
                    raise TypeError(f"run() returned {type(result).__name__}, not dict")
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001 - one scenario's failure is recorded
                ok = False
                self.log(f"  FAILED: {exc!r}")
                traceback.print_exc()
                print(self.server.log_tail(), file=sys.stderr, flush=True)
                result = {"error": repr(exc), "runs": []}
            result.setdefault("description", scenario.description)
            result["seconds"] = round(time.monotonic() - started, 1)
            results[scenario.name] = result
        return results, ok

    # --- the whole run ---------------------------------------------------------------
    def main(self) -> int:
        args = self.args
        self.log(
            f"make bench{' --quick' if args.quick else ''}: "
            f"{', '.join(s.name for s in self.scenarios)}; {os.cpu_count()} CPUs"
        )
        machine = _machine()
        before = after = None
        if not args.no_reference:
            before = self.reference_under_same_conditions("before")
        skus = self.prepare_database()
        vacuum_stand_in = None
        if not autovacuum.server_runs_autovacuum(self.bench_db.url):
            self.log("  the server runs with autovacuum off: the harness stands in for it")
            vacuum_stand_in = autovacuum.Autovacuum(self.bench_db.url)
            vacuum_stand_in.start()
        self.start_server()
        scenarios, ok = self.run_scenarios(skus)
        self.server.stop()
        vacuumed = vacuum_stand_in.stop() if vacuum_stand_in else {"stand_in": False}
        if not args.no_reference and not args.quick:
            after = self.reference_under_same_conditions("after")
        reference_data = report.reference_summary(before, after)
        report.add_ratios(scenarios, reference_data)
        machine["loadavg_at_end"] = _loadavg()
        data = {
            # The headline first (docs/performance.md, "Running the headline").
            "headline": headline.summary(scenarios),
            "noisy": report.noisy(reference_data),
            "started_at": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "finished_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "quick": args.quick,
            "git": _git(),
            "machine": machine,
            "config": {
                "workers": args.workers,
                "worker_class": "sync",
                "duration_s": args.duration,
                "warmup_s": args.warmup,
                "products": len(skus),
                "database": self.bench_db.dbname,
                "settings": "bench.gunicorn_settings",
                "db_pool": self.environ.get("DB_POOL", "true (default)"),
                "rss_checkouts": args.rss_checkouts,
                "steady_seconds": args.steady_seconds,
                "sustained_rates": args.sustained_rates,
                "sustained_seconds": args.sustained_seconds,
                "oscar_sustained_rates": args.oscar_sustained_rates,
                "autovacuum": vacuumed,
            },
            "reference": reference_data,
            "scenarios": scenarios,
            "capacity": report.capacity(scenarios, os.cpu_count()),
        }
        data["targets"] = report.targets(data)
        stem = self.started.strftime("%Y%m%dT%H%M%SZ") + ("-quick" if args.quick else "")
        out_dir = Path(args.results_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        json_path, png_path = out_dir / f"{stem}.json", out_dir / f"{stem}.png"
        report.write_json(json_path, data)
        report.plot(png_path, data)
        self._print_summary(data)
        self.log(f"wrote {_show(json_path)} and {_show(png_path)}")
        return 0 if ok else 1

    def _print_summary(self, data: dict) -> None:
        ref = data["reference"] or {}
        mark = "noisy: " if data.get("noisy") else ""
        scenarios = data["scenarios"]
        if "sustained" in scenarios or "oscar_sustained" in scenarios:
            text = headline.text(scenarios.get("sustained"), scenarios.get("oscar_sustained"))
            print("\n" + mark + text, flush=True)
        if data.get("noisy"):
            self.log(
                f"NOISY RUN: pgbench moved {ref.get('pgbench_spread_pct')} % between before and "
                f"after (> {report.NOISY_SPREAD_PCT} %); do not publish it, run it again alone"
            )
        if ref:
            self.log(
                f"reference: pgbench {ref.get('pgbench_tps')} TPS "
                f"(spread {ref.get('pgbench_spread_pct')} %), redis-benchmark "
                f"{ref.get('redis_ops_per_s')} ops/s (spread {ref.get('redis_spread_pct')} %)"
            )
        for name, result in data["scenarios"].items():
            for run in result.get("runs", []):
                ratio = run.get("rps_per_pgbench_tps")
                self.log(
                    f"  {mark}{name} {run['label']} c={run['concurrency']}: {run['rps']} req/s"
                    + (f" = {ratio:.3f} × pgbench TPS" if ratio is not None else "")
                    + f", p50 {run['latency_ms']['p50']} ms, p99 {run['latency_ms']['p99']} ms"
                )
        print("\n" + report.capacity_text(data.get("capacity")), flush=True)
        print("\nTargets (value in this run, target, verdict):", flush=True)
        print(report.targets_table(data.get("targets", [])), flush=True)

    def close(self) -> None:
        """Stop gunicorn, close connections, drop the scratch databases and cache keys."""
        if self.server is not None:
            self.server.stop()
            log_path = self.server.log_path
            if log_path.exists() and not self.args.keep_db:
                log_path.unlink()
        if self.django_ready:
            from django.db import connections

            connections.close_all()
        if not self.args.keep_db:
            for target in self.created:
                try:
                    drop_database(target)
                except Exception as exc:  # noqa: BLE001 - report, go on cleaning up
                    print(f"could not drop {target.dbname}: {exc!r}", file=sys.stderr)
        _delete_cache_keys(self.redis, self.cache_prefix)


def _delete_cache_keys(target: RedisTarget, prefix: str) -> None:
    import redis

    try:
        client = redis.Redis(
            host=target.host, port=target.port, db=target.db, password=target.password or None
        )
        keys = list(client.scan_iter(match=f"{prefix}:*", count=500))
        if keys:
            client.delete(*keys)
        client.close()
    except redis.RedisError as exc:
        print(f"could not delete cache keys {prefix}:*: {exc!r}", file=sys.stderr)


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": _loadavg(),
    }


def _git() -> dict:
    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument(
        "--scenario", action="append", metavar="NAME", help="run only this scenario (repeatable)"
    )
    parser.add_argument("--duration", type=float, help="seconds per load run (default 10; quick 2)")
    parser.add_argument("--warmup", type=float, help="unmeasured seconds per load run (1; 0.5)")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers (4)")
    parser.add_argument("--results-dir", default=str(RESULTS_DIR), help="where results go")
    parser.add_argument(
        "--keep-db", action="store_true", help="keep the bench databases and gunicorn's log"
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="skip pgbench/redis-benchmark (no ratios)"
    )
    parser.add_argument(
        "--rss-checkouts",
        type=int,
        help="checkouts the rss scenario samples across (default 10000; quick 600)",
    )
    parser.add_argument(
        "--steady-seconds",
        type=float,
        help="seconds each steady phase of the relay scenario runs (default 300; quick 10)",
    )
    parser.add_argument(
        "--sustained-rates",
        type=_rates,
        help="orders/s of the sustained scenario's steps, rising (default 20,40,60,80,100,120; "
        "quick 5,10)",
    )
    parser.add_argument(
        "--oscar-sustained-rates",
        type=_rates,
        help="orders/s of the oscar_sustained scenario's steps, rising (default "
        "2,4,6,8,10,12,16,20,25,30; quick 1,2)",
    )
    parser.add_argument(
        "--sustained-seconds",
        type=float,
        help="seconds each step of the sustained scenarios sends (default 180; quick 10)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    if args.duration is None:
        args.duration = 2.0 if args.quick else 10.0
    if args.warmup is None:
        args.warmup = 0.5 if args.quick else 1.0
    if args.rss_checkouts is None:
        args.rss_checkouts = 600 if args.quick else 10_000
    if args.steady_seconds is None:
        args.steady_seconds = 10.0 if args.quick else 300.0
    if args.sustained_seconds is not None and args.sustained_seconds <= 0:
        parser.error("--sustained-seconds must be positive")
    if min(args.duration, args.workers, args.rss_checkouts, args.steady_seconds) <= 0:
        parser.error("--duration, --workers, --rss-checkouts and --steady-seconds must be positive")
    return args


def _rates(text: str) -> tuple[float, ...]:
    """Parse "20,40,60" into rising positive rates."""
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from exc
    if not rates or min(rates) <= 0 or list(rates) != sorted(rates):
        raise argparse.ArgumentTypeError(f"rates must be positive and rising: {text!r}")
    return rates


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scenarios = discover()
    if args.list:
        for scenario in scenarios:
            print(f"{scenario.name:24} {scenario.description}")
        return 0
    if args.scenario:
        known = {s.name for s in scenarios}
        unknown = sorted(set(args.scenario) - known)
        if unknown:
            print(f"unknown scenario(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
            return 2
        scenarios = [s for s in scenarios if s.name in args.scenario]
    # SIGTERM unwinds like Ctrl-C, through the same cleanup.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        bench = Bench(args, scenarios)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    try:
        return bench.main()
    except KeyboardInterrupt:
        bench.log("interrupted: cleaning up")
        return 130
    finally:
        bench.close()


if __name__ == "__main__":
    sys.exit(main())
