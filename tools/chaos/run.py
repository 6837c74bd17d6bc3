"""`make chaos`: the real system under a mixed workload, SIGKILLs, failpoints and restarts.

    python -m tools.chaos [--duration S] [--hosts 1|2] [--broker redis|rabbitmq] [--long]
                          [--seed N] [--run-dir DIR] [--keep] [--shoppers N]

Steps (each printed as it happens; docs/failure-model.md, "Chaos run"):
1. a PostgreSQL cluster of its own (tools/chaos/postgres.py, on a free
   loopback port, in RUN_DIR/postgres: the run crashes and hangs it), our
   own empty redis-server on a free port, the broker (Redis database 1 of
   that server, or a RabbitMQ vhost `chaos_<timestamp>`), one payment
   simulator shared by every host (duplicated, delayed webhooks);
2. migrate and a staff user and a courier, once; then 1 or 2 hosts: each a supervisor
   (`python -m runner`) with its own gunicorn, celery workers, beat and relay;
3. products with scarce stock, shopper accounts, `check snapshot`;
4. the workload (tools/chaos/workload.py) and the killer (tools/chaos/killer.py)
   for the duration; the Redis server is killed and started empty once, and
   on RabbitMQ the vhost is deleted and created again once;
5. `check wait`; the liveness phase (tools/chaos/liveness.py: staff end every
   needs-attention item through the admin); `check verify`, the table,
   RUN_DIR/chaos.png;
6. everything stopped; the cluster's data folder removed unless --keep.

Exit status: 0 when every invariant holds, 1 on a violation, a wait timeout,
an item the liveness phase could not end,
a killed program its supervisor did not restart, or a failure of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import requests

from devtools.simulator.webhooks import event_body, sign_webhook
from runner.processes import die_with_parent, free_port, stop_group, tail

from . import liveness, plot
from .faultproxy import FaultProxy, via
from .faults import JUDGED, Faults, failpoint_kills, hung_requests, timing_lines
from .killer import Killer, processes
from .postgres import ChaosPostgres
from .workload import ACCOUNTS_PER_SHOPPER, AnswerLog, Client, Product, Workload

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK_PATH = "/api/v1/payments/webhooks/"
CHECKER = os.environ.get("CHAOS_CHECKER", "tools.chaos.check")
LONG_DURATION = 1800.0
# The last host runs all its programs with its clock this far off (libfaketime;
# the monotonic clock is left alone). Leases, expiry and retention must be
# judged by the database clock: a decision on the host clock shows as a violation.
DEFAULT_SKEW = "+5m"
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
# Seconds a killed supervisor's children get to stop on their parent-death
# signal: gunicorn's graceful timeout (10 s) and a margin.
ORPHAN_DEADLINE = 15.0
WAIT_TIMEOUT = 300
UP_WAIT = 12.0

# Failpoints that make a process exit at an exact line (docs/failure-model.md);
# each fires N times in total across every process (shared SHOP_FAILPOINTS_DIR).
FAILPOINTS = (
    "checkout.reserve.after_hold",
    "checkout.capture.before",
    "checkout.capture.after",
    "order.create.reserved.after_commit",
    "order.create.finished.before_commit",
    "order.confirm.finished.after_commit",
    "order.cancel.finished.before_commit",
    "idempotency.claim.after_insert",
    "idempotency.claim.after_takeover",
    "payments.capture.after_provider",
    "payments.settle.after_lookup",
    "payments.refund.before_provider",
    "payments.refund.after_provider",
    "compensation.refund.after_effect",
    "compensation.restock.before_effect",
    "relay.published",
    "returns.receive.before_decide",
    "orders.cancel.locked",
    "shipment.create.locked",
)

# Shorter clocks than production so that what a kill leaves open is finished
# (by a retry, the completer, settlement, expiry) within the wait.
TUNING = {
    "IDEMPOTENCY_LEASE_TTL": "20",
    "IDEMPOTENCY_ABANDON_AFTER": "30",
    "IDEMPOTENCY_COMPLETER_EVERY": "10",
    "ORDER_RESERVATION_TTL_SECONDS": "60",
    "ORDER_EXPIRY_SWEEP_SECONDS": "5",
    "PAYMENTS_SETTLE_BACKOFF_MAX": "20",
    "PAYMENTS_REFUND_BACKOFF_MAX": "20",
    "COMPENSATION_BACKOFF_MAX": "20",
    "OUTBOX_RELAY_BACKOFF_MAX": "20",
    "OUTBOX_DELIVERY_BACKOFF_MAX": "20",
    "SHOP_REGISTER_THROTTLE_RATE": "10000/min",
    "SHOP_TOKEN_THROTTLE_RATE": "10000/min",
    "LOG_LEVEL": "WARNING",
}


# Run by `manage.py shell -c` before the hosts start: the staff user and the courier.
STAFF_SCRIPT = """
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from core.permissions import COURIERS_GROUP
from django.contrib.auth.models import Permission
from backoffice.needs_attention import ACTIONS, VIEW_PERMISSION
from backoffice.permissions import staff_permissions
User = get_user_model()
staff = User.objects.create_user("chaos-staff", password="{password}", is_staff=True)
# The liveness phase works the admin's "Needs attention" page: what it shows and its actions;
# the workload's staff API calls (refunds, shipments, ...) each need their permission.
needed = set(VIEW_PERMISSION.values()) | set(a.permission for k in ACTIONS.values() for a in k)
for name in needed | staff_permissions():
    app, codename = name.split(".")
    perm = Permission.objects.get(content_type__app_label=app, codename=codename)
    staff.user_permissions.add(perm)
courier = User.objects.create_user("chaos-courier", password="{password}")
courier.groups.add(Group.objects.get_or_create(name=COURIERS_GROUP)[0])
"""


def say(message: str) -> None:
    print(f"chaos: {message}", flush=True)


def utc_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


# -- services ------------------------------------------------------------------


class RedisServer:
    """Our own redis-server (no persistence), so it can be killed and started empty."""

    def __init__(self, run_dir: Path, port: int) -> None:
        self.run_dir = run_dir
        self.port = port
        self.proc: subprocess.Popen | None = None
        self.log = (run_dir / "redis.log").open("ab")

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", str(self.run_dir)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run(
                ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True
            )
            if probe.stdout.strip() == "PONG":
                return
            time.sleep(0.1)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart_empty(self) -> None:
        self.kill()
        self.start()


class RabbitVhost:
    """A RabbitMQ vhost of our own; "restarting the broker empty" deletes and recreates it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.url = f"amqp://guest:guest@127.0.0.1:5672/{name}"

    def _ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True)

    def create(self) -> None:
        self._ctl("add_vhost", self.name)
        self._ctl("set_permissions", "-p", self.name, "guest", ".*", ".*", ".*")

    def delete(self) -> None:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.name], capture_output=True)

    def recreate(self) -> None:
        self.delete()
        self.create()


class Simulator:
    """The one payment simulator every host uses; its ledger is RUN_DIR/provider.sqlite3.

    Its ports are chosen once, so that after a SIGKILL it starts again where the
    hosts (and the settlement of what it left open) expect it, with its ledger.
    """

    def __init__(self, run_dir: Path, *, webhook_url: str, secret: str, env: dict) -> None:
        self.log = (run_dir / "simulator.log").open("ab")
        self.port = free_port()
        self.control_port = free_port()
        self.argv = [
            sys.executable, "-m", "devtools.simulator", "--host", "127.0.0.1",
            "--port", str(self.port), "--control-port", str(self.control_port),
            "--db", str(run_dir / "provider.sqlite3"),
            "--webhook-url", webhook_url, "--webhook-secret", secret,
            "--webhook-duplicate-rate", "0.3", "--webhook-max-delay-ms", "3000",
        ]  # fmt: skip
        self.env = env
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secret
        self.proc: subprocess.Popen = self._start()

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=self.log,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the payment simulator did not start (see simulator.log)")
        info = json.loads(line)
        if int(info["port"]) != self.port:
            raise RuntimeError(f"the payment simulator took port {info['port']}, not {self.port}")
        return proc

    def kill_and_restart(self) -> None:
        """SIGKILL the simulator (no shutdown), start it again on the same ports and ledger."""
        self.proc.kill()
        self.proc.wait()
        deadline = time.monotonic() + 30
        while True:
            try:
                self.proc = self._start()
                return
            except (RuntimeError, ValueError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)  # the port may linger a moment after the kill

    def events(self) -> list[dict]:
        response = requests.get(
            f"http://127.0.0.1:{self.control_port}/_control/webhooks", timeout=10
        )
        return response.json()["results"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Host:
    """One group of processes: a supervisor (`python -m runner`) with its own programs."""

    def __init__(self, name: str, run_dir: Path, port: int, env: dict) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.var = run_dir / f"host-{name}"
        self.var.mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir / f"host-{name}.log"
        self.env = env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            process_group=0,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )

    def healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"host {self.name} exited:\n{tail(self.log_path)}")
            if self.healthy():
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"host {self.name} not healthy in {timeout:.0f} s:\n{tail(self.log_path)}"
        )

    def kill_supervisor(self) -> list[str]:
        """SIGKILL the supervisor; return its descendants still alive ORPHAN_DEADLINE s later.

        runner/ gives every program SIGKILL as its parent-death signal (and
        Celery's pool children and gunicorn's workers follow their parent), so
        each must be gone by itself; an orphan is killed here (the run goes
        on) and returned, so the run reports it as a problem.
        """
        assert self.proc is not None
        try:
            family = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        self.proc.kill()
        self.proc.wait()
        _, alive = psutil.wait_procs(family, timeout=ORPHAN_DEADLINE)
        orphans = []
        for proc in alive:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                orphans.append(f"pid {proc.pid} ({' '.join(proc.cmdline())[:80]})")
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        return orphans

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                say(f"host {self.name}: supervisor did not stop in 40 s; killing it")
        # The supervisor's children lead their own groups; whatever is left goes too.
        for pids in processes(self.proc.pid).values():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        stop_group(self.proc.pid, sig=signal.SIGKILL, timeout=5)
        self.proc.wait()


# -- the run -------------------------------------------------------------------


class Timeline:
    """RUN_DIR/timeline.jsonl: kills, failpoints, restarts and throughput samples."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("a", encoding="utf8")
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def __call__(self, record: dict) -> None:
        with self.lock:
            self.file.write(json.dumps(record, separators=(",", ":")) + "\n")
            self.file.flush()
            self.counts[record["type"]] += 1

    def close(self) -> None:
        with self.lock:
            self.file.close()


# Judged because every wait of a web request is cut to what is left of its deadline
# (core.deadline.bounded: the pool, a publish, the provider; docs/failure-model.md,
# "What broke").
HUNG_ROW = "no request past its deadline + 2 s in a dependency fault"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tools.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=180.0, help="workload seconds (180)")
    parser.add_argument("--hosts", type=int, choices=(1, 2), default=2)
    parser.add_argument("--broker", choices=("redis", "rabbitmq"), default="redis")
    parser.add_argument(
        "--long", action="store_true", help=f"at least {LONG_DURATION:.0f} s, 2 hosts"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--run-dir", type=Path, default=None, help="default var/chaos/<UTC time>/")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's data folder")
    parser.add_argument(
        "--shoppers",
        type=int,
        default=None,
        help=f"shopper threads (6 per host), each with {ACCOUNTS_PER_SHOPPER} accounts in turn",
    )
    parser.add_argument("--wait-timeout", type=int, default=WAIT_TIMEOUT)
    parser.add_argument(
        "--skew",
        default=DEFAULT_SKEW,
        help=f"the last host's clock offset, libfaketime syntax ({DEFAULT_SKEW}); 'none': no skew",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="copy the plot to docs/chaos/ (the table is RUN_DIR/table.md either way)",
    )
    args = parser.parse_args(argv)
    if args.long:
        args.duration = max(args.duration, LONG_DURATION)
        args.hosts = 2
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    if args.shoppers is None:
        args.shoppers = 6 * args.hosts
    return args


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stamp = utc_stamp()
        self.run_dir = (args.run_dir or ROOT / "var" / "chaos" / self.stamp).resolve()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(args.seed)
        self.db: ChaosPostgres | None = None
        self.redis: RedisServer | None = None
        self.vhost: RabbitVhost | None = None
        self.simulator: Simulator | None = None
        self.hosts: list[Host] = []
        self.timeline = Timeline(self.run_dir / "timeline.jsonl")
        self.answers = AnswerLog(self.run_dir / "answers.jsonl")
        self.env: dict[str, str] = {}
        self.problems: list[str] = []
        self.proxies: dict[tuple[str, str], FaultProxy] = {}
        self.faults: Faults | None = None
        self.staff_password = ""
        self.liveness: liveness.Outcome | None = None

    # -- setup -----------------------------------------------------------------

    def start_services(self) -> None:
        args = self.args
        name = "chaos_" + self.stamp.lower().replace("t", "_").rstrip("z")
        # A cluster of the run's own, which the run may crash and hang; the
        # shared server on DATABASE_URL is never touched.
        self.db = ChaosPostgres(self.run_dir)
        self.db.create()
        say(f"own PostgreSQL cluster: {self.db.name}")
        redis_port = free_port()
        self.redis = RedisServer(self.run_dir, redis_port)
        self.redis.start()
        say(f"own redis-server on port {redis_port}")
        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        if args.broker == "rabbitmq":
            self.vhost = RabbitVhost(name)
            self.vhost.create()
            broker = self.vhost.url
            say(f"RabbitMQ vhost {name}")
        else:
            broker = f"redis://127.0.0.1:{redis_port}/1"
        secret = secrets.token_hex(16)
        ports = [free_port() for _ in range(args.hosts)]
        failpoints_dir = self.run_dir / "failpoints"
        failpoints_dir.mkdir(exist_ok=True)
        scale = max(1, round(args.duration / 180))
        spec = ",".join(f"{name}=exit@{scale}" for name in FAILPOINTS)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SHOP_", "CELERY_"))},
            **TUNING,
            "DJANGO_SETTINGS_MODULE": "config.settings.base",
            "SHOP_ENV_FILE": str(self.run_dir / "no.env"),  # the checkout's .env stays out
            "DATABASE_URL": self.db.url,
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": broker,
            "PAYMENTS_WEBHOOK_SECRET": secret,
            "PYTHONUNBUFFERED": "1",
        }
        self.simulator = Simulator(
            self.run_dir,
            webhook_url=f"http://127.0.0.1:{ports[0]}{WEBHOOK_PATH}",
            secret=secret,
            env=self.env,
        )
        self.env["PAYMENTS_PROVIDER_URL"] = self.simulator.url
        self.env["SIMULATOR_WEBHOOK_URL"] = f"http://127.0.0.1:{ports[0]}{WEBHOOK_PATH}"
        say(
            f"payment simulator on port {self.simulator.port}"
            f" (control {self.simulator.control_port})"
        )
        self.manage("migrate", "--noinput", "-v0")
        # Our own staff and courier instead of seed_demo: its demo return that
        # waits for staff (needs_attention) keeps its later steps polling, so
        # the broker would never be quiet; and its demo orders go through
        # checkout, whose failpoints would end it.
        self.staff_password = secrets.token_urlsafe(12)
        self.manage("shell", "-c", STAFF_SCRIPT.format(password=self.staff_password))
        for index, port in enumerate(ports):
            host_name = "ab"[index]
            # The host's links to the database and the broker go through fault
            # proxies of its own (partitions, resets); setup above did not.
            db_proxy = FaultProxy(target=(self.db.host, self.db.port), name=f"{host_name}-db")
            broker_parts = urlsplit(broker)
            broker_proxy = FaultProxy(
                target=(broker_parts.hostname or "127.0.0.1", broker_parts.port or 5672),
                name=f"{host_name}-broker",
            )
            for link, proxy in (("db", db_proxy), ("broker", broker_proxy)):
                proxy.start()
                self.proxies[(host_name, link)] = proxy
            host_env = {
                **self.env,
                "DATABASE_URL": via(self.db.url, db_proxy.port),
                "CELERY_BROKER_URL": via(broker, broker_proxy.port),
                "SHOP_VAR_DIR": str(self.run_dir / f"host-{host_name}"),
                "SHOP_HOST_NAME": host_name,
                "PORT": str(port),
                # The supervisor's own simulator is not in SHOP_PROGRAMS; a
                # runner without that knob starts it on an unused port.
                "SIMULATOR_PORT": str(free_port()),
                "SHOP_PROGRAMS": "web,worker,beat,relay",
                "SHOP_SETUP": "metrics-dir,collectstatic",
                "SHOP_WORKERS": "2",
                "WORKER_CONCURRENCY": "2",
                "WEB_CONCURRENCY": "2",
                "SHOP_FAILPOINTS": spec,
                "SHOP_FAILPOINTS_DIR": str(failpoints_dir),
            }
            if self.skewed(host_name):
                # The monotonic clock stays true (waits and timeouts last what
                # they say); tools/chaos/skew/sitecustomize.py makes time.sleep
                # work under this libfaketime (it explains why).
                host_env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME=args.skew,
                                FAKETIME_DONT_FAKE_MONOTONIC="1",
                                PYTHONPATH=str(Path(__file__).parent / "skew"))  # fmt: skip
                say(f"host {host_name}: clock skewed {args.skew} (libfaketime)")
            host = Host(host_name, self.run_dir, port, host_env)
            self.hosts.append(host)
            host.start()
            host.wait_healthy(300)
            say(f"host {host_name} up at {host.url} (log {host.log_path})")

    def skewed(self, host_name: str) -> bool:
        """The last host of two runs with a skewed clock (--skew), when libfaketime is here."""
        if (
            self.args.skew == "none"
            or self.args.hosts < 2
            or host_name != "ab"[self.args.hosts - 1]
        ):
            return False
        if not Path(LIBFAKETIME).exists():
            self.problems.append(
                f"--skew {self.args.skew}: {LIBFAKETIME} missing (apt-get install faketime)"
            )
            return False
        return True

    def manage(self, *argv: str) -> None:
        say(f"manage.py {' '.join(a if len(a) < 40 else '...' for a in argv)}")
        with (self.run_dir / "setup.log").open("ab") as log:
            subprocess.run(
                [sys.executable, "manage.py", *argv],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=True,
            )

    def checker(self, *argv: str, timeout: float | None = None) -> int:
        command = [sys.executable, "-m", CHECKER, *argv, "--run-dir", str(self.run_dir)]
        say("$ " + " ".join(command[1:]))
        try:
            return subprocess.run(command, cwd=ROOT, env=self.env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 3

    def prepare_actors(self) -> Workload:
        hosts = {h.name: h.url for h in self.hosts}
        log = self.answers

        def token(username: str, password: str) -> str:
            response = requests.post(
                f"{self.hosts[0].url}/api/v1/auth/token/",
                json={"username": username, "password": password},
                timeout=30,
            )
            response.raise_for_status()
            return response.json()["token"]

        staff = token("chaos-staff", self.staff_password)
        courier = token("chaos-courier", self.staff_password)
        admin = Client(actor="staff", token=staff, hosts=hosts, log=log, rng=self.rng)
        # Two scarce products (reservations conflict), the rest enough for the run.
        plenty = int(60 * max(1.0, self.args.duration / 180) * self.args.hosts)
        stocks = [3, 6, plenty, plenty, plenty * 2]
        products = []
        for index, stock in enumerate(stocks):
            sku = f"CHAOS-{index}"
            price = f"{self.rng.randint(3, 40)}.{self.rng.randint(0, 99):02d}"
            answer = admin.send(
                "product",
                "POST",
                "/api/v1/products/",
                host=self.hosts[0].name,
                body={"sku": sku, "name": f"Chaos {index}", "price": price,
                      "currency": "EUR", "stock": stock},
            )  # fmt: skip
            if answer.status != 201:
                raise RuntimeError(f"creating {sku}: {answer.status} {answer.body}")
            products.append(Product(sku, price, stock))

        def register(index: int) -> tuple[str, str]:
            username = f"chaos{index}-{uuid.uuid4().hex[:6]}"
            response = requests.post(
                f"{self.hosts[index % len(self.hosts)].url}/api/v1/auth/register/",
                json={"username": username, "email": f"{username}@example.com",
                      "password": secrets.token_urlsafe(12)},
                timeout=30,
            )  # fmt: skip
            response.raise_for_status()
            return username, response.json()["token"]

        # Each shopper thread takes turns with ACCOUNTS_PER_SHOPPER accounts (workload.py).
        accounts = self.args.shoppers * ACCOUNTS_PER_SHOPPER
        with ThreadPoolExecutor(max_workers=8) as pool:
            shoppers = list(pool.map(register, range(accounts)))
        say(
            f"{len(products)} products (stocks {stocks}), {self.args.shoppers} shoppers "
            f"taking turns with {len(shoppers)} accounts"
        )
        return Workload(
            hosts=hosts,
            log=log,
            products=products,
            shoppers=shoppers,
            staff_token=staff,
            courier_token=courier,
            seed=self.args.seed,
            resend_webhooks=self.resend_webhooks,
            threads_of_shoppers=self.args.shoppers,
        )

    def resend_webhooks(self, provider: Client) -> None:
        """Send a few of the provider's delivered events again, shuffled (late, out of order)."""
        assert self.simulator is not None
        sent = [e for e in self.simulator.events() if e.get("deliveries", 0) >= 1]
        picked = provider.rng.sample(sent, k=min(len(sent), provider.rng.randint(1, 4)))
        for event in picked:
            body = event_body(event)
            signature = sign_webhook(
                secret=self.simulator.secret, timestamp=int(time.time()), body=body
            )
            provider.send(
                "webhook", "POST", WEBHOOK_PATH, raw=body, headers={"Shop-Signature": signature}
            )

    # -- chaos -----------------------------------------------------------------

    def watch_failpoints(self, stop: threading.Event) -> None:
        seen: set[str] = set()
        directory = self.run_dir / "failpoints"
        while not stop.wait(1.0):
            for name in sorted(os.listdir(directory)):
                if name not in seen:
                    seen.add(name)
                    self.timeline({"t": time.time(), "type": "failpoint", "name": name})

    def progress(self, stop: threading.Event, started: float, killer: Killer) -> None:
        while not stop.wait(5.0):
            total, by_status = self.answers.snapshot()
            self.timeline(
                {"t": time.time(), "type": "sample", "answers": total, "by_status": by_status}
            )
            statuses = " ".join(f"{k}:{v}" for k, v in sorted(by_status.items()))
            say(
                f"{time.monotonic() - started:5.0f}/{self.args.duration:.0f} s  requests {total}"
                f"  [{statuses}]  kills {len(killer.kills)}"
                f"  failpoints {self.timeline.counts['failpoint']}"
            )

    def restart_redis(self) -> None:
        assert self.redis is not None
        say("restarting Redis empty (SIGKILL, new server on the same port)")
        self.redis.restart_empty()
        self.timeline({"t": time.time(), "type": "redis_restart"})

    def restart_broker(self) -> None:
        assert self.vhost is not None
        say(
            f"RabbitMQ: deleting and recreating vhost {self.vhost.name}"
            " (the broker restarted empty)"
        )
        self.vhost.recreate()
        self.timeline({"t": time.time(), "type": "broker_restart"})

    def restart_host(self, name: str, killer: Killer) -> str:
        """SIGKILL a host's supervisor, check no child outlived it, start the host again."""
        host = next(h for h in self.hosts if h.name == name)
        orphans = host.kill_supervisor()
        for orphan in orphans:
            self.problems.append(
                f"host {name}: {orphan} still running {ORPHAN_DEADLINE:.0f} s after its"
                " supervisor was SIGKILLed"
            )
        host.start()
        assert host.proc is not None
        killer.supervisors[name] = host.proc.pid
        host.wait_healthy(120)
        return f"{len(orphans)} orphans; healthy again"

    def chaos(self, workload: Workload) -> Killer:
        args = self.args
        killer = Killer(
            supervisors={h.name: h.proc.pid for h in self.hosts if h.proc is not None},
            timeline=self.timeline,
            rng=random.Random(args.seed + 1),
        )
        stop = threading.Event()
        started = time.monotonic()
        self.timeline({"t": time.time(), "type": "workload_start", "seed": args.seed})
        say(f"workload for {args.duration:.0f} s (seed {args.seed})")
        helpers = [
            threading.Thread(target=self.watch_failpoints, args=(stop,), daemon=True),
            threading.Thread(target=self.progress, args=(stop, started, killer), daemon=True),
        ]
        for helper in helpers:
            helper.start()
        workload.start()
        killer.start()
        events = [(0.4 * args.duration, self.restart_redis)]
        if self.vhost is not None:
            events.append((0.6 * args.duration, self.restart_broker))
        self.faults = Faults(
            proxies=self.proxies,
            hosts={h.name: h.url for h in self.hosts},
            timeline=self.timeline,
            rng=random.Random(args.seed + 2),
            redis_pid=lambda: self.redis.proc.pid if self.redis and self.redis.proc else None,
            rabbitmq=self.vhost is not None,
            postgres=self.db,
            simulator=self.simulator,
            restart_host=lambda name: self.restart_host(name, killer),
        )
        events = sorted(events + self.faults.schedule(args.duration), key=lambda e: e[0])
        self.faults.sample()
        while (elapsed := time.monotonic() - started) < args.duration:
            while events and elapsed >= events[0][0]:
                events.pop(0)[1]()
            time.sleep(0.2)
        say("stopping the workload and the killer")
        killer.halt()
        if self.faults is not None:
            self.faults.finish(timeout=180)  # no new fault; the one being made heals
        time.sleep(UP_WAIT)  # the last fault heals and is sampled back to 200
        if self.faults is not None:
            self.faults.stop()
            # Every /healthz sample, for the timings' reader (docs/failure-model.md).
            with (self.run_dir / "healthz.jsonl").open("w") as out:
                for sample in list(self.faults.samples):
                    out.write(json.dumps(sample) + "\n")
        busy = workload.join(timeout=120)
        if busy:
            say(f"still busy after 120 s (left running): {', '.join(busy)}")
        self.timeline({"t": time.time(), "type": "workload_end"})
        stop.set()
        killer.wait_restarts(timeout=90)
        for host in self.hosts:
            host.wait_healthy(120)
        return killer

    # -- end -------------------------------------------------------------------

    def report(self, workload: Workload, killer: Killer, wait_code: int, verify_code: int) -> bool:
        total, by_status = self.answers.snapshot()
        kinds = Counter(k["target"] for k in killer.kills)
        fired = sorted(os.listdir(self.run_dir / "failpoints"))
        rows: list[tuple[str, str, str]] = []
        try:
            result = json.loads((self.run_dir / "invariants.json").read_text())
            for item in result["invariants"]:
                rows.append((item["name"], str(item["checked"]), str(len(item["violations"]))))
        except (OSError, ValueError, KeyError):
            rows.append(("(invariants.json missing or unreadable)", "-", "?"))
        rows.append(("supervisors restarted every killed program", str(len(killer.kills)),
                     str(len(killer.not_restarted))))  # fmt: skip
        rows.append(("quiescent within the wait timeout", "1", "0" if wait_code == 0 else "1"))
        if self.liveness is not None:
            rows += self.liveness.rows()
        if self.faults is not None:
            # Every SIGKILL of a host's web server (a gunicorn worker or its master).
            web = [(k["host"], k["t"]) for k in killer.kills if k["target"].startswith("web-")]
            web += failpoint_kills(self.run_dir / "failpoints")  # exits in a gunicorn worker
            late_down, late_up = self.faults.judge(server_kills=web)
            judged = [f for f in self.faults.made if f.kind in JUDGED]
            rows.append(("/healthz 503 within 2 s of each dependency fault", str(len(judged)),
                         str(len(late_down))))  # fmt: skip
            rows.append(("/healthz 200 within 10 s of each heal", str(len(judged)),
                         str(len(late_up))))  # fmt: skip
            hung_judged, hung, outside = hung_requests(
                self.faults.made, plot.read_jsonl(self.run_dir / "answers.jsonl")
            )
            rows.append((HUNG_ROW, str(hung_judged), str(len(hung))))
            for message in hung[:10]:
                say(f"hung: {message}")
            for message in outside[:10]:
                say(f"slow before the server took it (not judged): {message}")
            unmade = self.faults.problems + self.faults.missing()
            rows.append(("dependency faults made as planned", str(len(self.faults.planned)),
                         str(len(unmade))))  # fmt: skip
            for message in self.faults.missing():
                say(f"faults: {message}")
            if self.faults.skipped:
                say(f"faults not made (their turn came after the end): {self.faults.skipped}")
            for late in late_down + late_up:
                say(f"healthz: {late}")
            print(f"dependency faults {len(self.faults.made)}: {self.faults.counts()}")
            for line in timing_lines(self.faults.made, self.faults.samples):
                print(line)
        width = max(len(r[0]) for r in rows)
        print()
        print(f"{'invariant':<{width}}  {'checked':>8}  {'violations':>10}")
        print(f"{'-' * width}  {'-' * 8}  {'-' * 10}")
        for name, checked, violations in rows:
            print(f"{name:<{width}}  {checked:>8}  {violations:>10}")
        print()
        statuses = ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items()))
        print(f"requests {total} ({statuses})")
        print(f"journeys: {dict(sorted(workload.counts.items()))}")
        if workload.retrier is not None:
            print(
                f"keys handed to the retrier: {workload.retrier.handed}"
                f" (finished by a retry: {workload.retrier.finished})"
            )
        print(f"kills {len(killer.kills)}: {dict(sorted(kinds.items()))}")
        print(f"failpoint exits {len(fired)}: {', '.join(fired) or '-'}")
        print(f"Redis restarted empty: {self.timeline.counts['redis_restart']}; "
              f"broker vhost recreated: {self.timeline.counts['broker_restart']}")  # fmt: skip
        faults_problems = self.faults.problems if self.faults is not None else []
        for message in killer.not_restarted + self.problems + faults_problems:
            print(f"PROBLEM: {message}")
        summary = {
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()},
            "requests": total,
            "by_status": by_status,
            "kills": dict(kinds),
            "failpoints": fired,
            "not_restarted": killer.not_restarted,
            "wait_code": wait_code,
            "verify_code": verify_code,
            "table": rows,
            "faults": self.faults.counts() if self.faults is not None else {},
            "fault_timings": timing_lines(self.faults.made, self.faults.samples)
            if self.faults is not None
            else [],
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.write_table(rows, total, by_status, kinds, fired)
        return (
            wait_code == 0
            and verify_code == 0
            and not killer.not_restarted
            and not self.problems
            and (self.liveness is not None and self.liveness.ok)
            and not faults_problems
            and all(r[2] == "0" for r in rows)
        )

    def write_table(
        self,
        rows: list[tuple[str, str, str]],
        total: int,
        by_status: dict[str, int],
        kinds: Counter[str],
        fired: list[str],
    ) -> None:
        """Write RUN_DIR/table.md, the results as docs/failure-model.md shows them."""
        args = self.args
        name = f"{self.stamp}-{args.broker}-{args.hosts}h-{args.duration:.0f}s.png"
        killed = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        skew = "" if args.skew == DEFAULT_SKEW else f" --skew={args.skew}"
        lines = [
            f'`make chaos CHAOS_ARGS="--duration {args.duration:.0f} --hosts {args.hosts}'
            f' --broker {args.broker}{skew} --seed {args.seed}"`, {self.stamp}:'
            f" {total} requests ({', '.join(f'{k}: {v}' for k, v in sorted(by_status.items()))}),"
            f" {sum(kinds.values())} SIGKILLs ({killed}),"
            f" {len(fired)} failpoint exits, Redis restarted empty"
            f" {self.timeline.counts['redis_restart']}×, broker vhost recreated"
            f" {self.timeline.counts['broker_restart']}×.",
            "",
            "| invariant | checked | violations |",
            "|---|---:|---:|",
            *(f"| {n} | {c} | {v} |" for n, c, v in rows),
            "",
        ]
        if self.faults is not None:
            counts = ", ".join(f"{k} {v}" for k, v in self.faults.counts().items())
            lines += [
                f"Dependency faults made: {counts or 'none'}.",
                "",
                *(f"- {line}" for line in timing_lines(self.faults.made, self.faults.samples)),
                "",
            ]
        lines += [
            f"![make chaos {self.stamp}](chaos/{name})",
            "",
        ]
        (self.run_dir / "table.md").write_text("\n".join(lines))
        if args.publish:
            target = ROOT / "docs" / "chaos"
            target.mkdir(exist_ok=True)
            (target / name).write_bytes((self.run_dir / "chaos.png").read_bytes())
            say(f"published docs/chaos/{name}; table in {self.run_dir / 'table.md'}")

    def close(self) -> None:
        for host in reversed(self.hosts):
            try:
                host.stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest whatever happens
                say(f"stopping host {host.name}: {exc}")
        for proxy in self.proxies.values():
            try:
                proxy.stop()
            except Exception as exc:  # noqa: BLE001 - stop the rest whatever happens
                say(f"stopping proxy {proxy.name}: {exc}")
        if self.simulator is not None:
            self.simulator.stop()
        if self.redis is not None:
            self.redis.kill()
        if self.vhost is not None:
            self.vhost.delete()
        if self.db is not None:
            self.db.drop()
            if self.args.keep:
                say(f"kept the cluster's data folder {self.db.server.data_dir}")
            else:
                shutil.rmtree(self.db.server.data_dir.parent, ignore_errors=True)
                say("removed the cluster's data folder")
        self.answers.close()
        self.timeline.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Run(args)
    say(f"run folder {run.run_dir}; {args.hosts} host(s), broker {args.broker}, seed {args.seed}")
    interrupted = threading.Event()

    def on_signal(signum, frame) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    ok = False
    try:
        run.start_services()
        workload = run.prepare_actors()
        if run.checker("snapshot") != 0:
            raise RuntimeError("check snapshot failed")
        killer = run.chaos(workload)
        # Through every hold's expiry (ORDER_RESERVATION_TTL_SECONDS): an expiry
        # writes an event, which must not land after the last wait.
        wait_code = run.checker("wait", "--timeout", str(args.wait_timeout), "--through-holds",
                                timeout=args.wait_timeout + 60)  # fmt: skip
        if wait_code != 0:
            run.problems.append(f"check wait exited {wait_code} (not quiescent)")
        run.liveness = liveness.resolve(
            url=run.hosts[0].url,
            username="chaos-staff",
            password=run.staff_password,
            wait=lambda: run.checker(
                "wait",
                "--timeout",
                str(liveness.ROUND_WAIT),
                "--through-holds",
                timeout=liveness.ROUND_WAIT + 60,
            ),  # fmt: skip
            say=say,
        )
        verify_code = run.checker("verify")
        out = plot.plot(
            run.run_dir,
            title=f"make chaos: {args.duration:.0f} s, {args.hosts} host(s), {args.broker}, "
            f"seed {args.seed}",
        )
        say(f"plot {out}")
        ok = run.report(workload, killer, wait_code, verify_code)
    except KeyboardInterrupt:
        say("interrupted")
    except Exception:  # noqa: BLE001 - report, then clean up everything started
        traceback.print_exc()
    finally:
        run.close()
    say(("PASSED" if ok else "FAILED") + f" ({run.run_dir})")
    return 0 if ok else 1
