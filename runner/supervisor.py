"""The run command: the whole shop from one process (`make run`, docs/running.md).

Starts the embedded PostgreSQL and Redis unless DATABASE_URL / REDIS_URL are
set, runs the SETUP steps (migrate, collectstatic, seed_demo) under the setup
lock (runner/setup_lock.py), then keeps every program of PROGRAMS running
(SHOP_PROGRAMS, SHOP_SETUP and SHOP_WORKERS choose which: one host of several,
docs/deployment.md): a child that exits is restarted with
backoff, and so is an embedded server that dies. Ctrl-C or SIGTERM stops
every child (and its process group), then the embedded servers, and exits.
A supervisor killed with SIGKILL takes its children with it (the kernel's
parent-death signal, SIGKILL: see `Supervisor.spawn`), and the next start
clears whatever is still left from the state file in the runtime folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from . import BASE_DIR, load_env_file, var_dir
from .embedded.services import EmbeddedServices
from .manage import PUBLISHED, publish
from .processes import (
    ServerBusy,
    die_with_parent,
    ensure_owned_dir,
    group_alive,
    port_is_free,
    run_dir_for,
    stop_group,
    stop_leader_then_group,
)
from .setup_lock import setup_lock
from .webhook_secret import webhook_env


@dataclass(frozen=True)
class Program:
    """One long-running process: a name, its argv and extra environment.

    Both may use the placeholders {python}, {host}, {port}, {var} (data
    folder), {run} (short runtime folder for sockets), {web_workers}, {web_threads},
    {worker_concurrency}, {host_name} and, in a worker, {worker} (its name,
    worker-N); add more to `context()` when a program needs them.
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


# The process table: one line per long-running process. Later areas add
# theirs here.
PROGRAMS: list[Program] = [
    Program(
        "web",
        (
            "{python}", "-m", "gunicorn", "config.wsgi:application",
            "--bind", "{host}:{port}", "--workers", "{web_workers}",
            # Threads (gunicorn's gthread worker): a request waiting on a hung
            # dependency holds one thread, not the worker, so /healthz still
            # gets a thread and answers 503 in time (docs/failure-model.md,
            # "Dependency faults"; tests/backoffice/test_healthz_busy.py).
            "--threads", "{web_threads}",
            "--graceful-timeout", "10", "--access-logfile", "-",
            "--control-socket", "{run}/gunicorn.ctl",
        ),
    ),
    Program(
        # SHOP_WORKERS copies of it, worker-1 ... worker-N; the node name holds
        # the host's name so that two hosts (or two on one machine) never collide.
        "worker",
        (
            "{python}", "-m", "celery", "--app", "config.celery:app", "worker",
            "--loglevel", "INFO", "--concurrency", "{worker_concurrency}",
            "--hostname", "{worker}-{host_name}@%h",
        ),
    ),
    Program(
        "beat",
        (
            "{python}", "-m", "celery", "--app", "config.celery:app", "beat",
            "--loglevel", "INFO", "--schedule", "{var}/celerybeat-schedule",
        ),
    ),
    Program(
        # The outbox relay: publishes outbox rows (claim, deliveries, publish,
        # mark) and re-publishes overdue deliveries; beat has a fallback task.
        "relay",
        ("{python}", "manage.py", "relay_outbox"),
    ),
    Program(
        # The simulated payment provider: an outside system with its own
        # ledger file, reached over loopback like a real provider.
        "payments-simulator",
        (
            "{python}", "-m", "devtools.simulator", "--host", "127.0.0.1",
            "--port", "{sim_port}", "--db", "{var}/payments-simulator.sqlite3",
        ),
    ),
]  # fmt: skip

# Environment for every program and setup step (placeholders allowed); a
# variable already set in the caller's environment wins.
ENV: dict[str, str] = {
    "PAYMENTS_PROVIDER_URL": "http://127.0.0.1:{sim_port}",
    # Web and worker processes share their metrics files here (docs/operations.md).
    "PROMETHEUS_MULTIPROC_DIR": "{var}/prometheus",
    # Sent mail as files a person can open, one per message (README, "Configuration").
    "EMAIL_URL": "file://{var}/mail",
}

# One-off steps before the programs start, in order; a failure stops the run.
SETUP: list[Program] = [
    # Empty the metrics folder: a stale file would add an old run's counts.
    Program(
        "metrics-dir", ("{python}", "-m", "backoffice.prometheus_multiproc", "{var}/prometheus")
    ),
    Program("migrate", ("{python}", "manage.py", "migrate", "--noinput")),
    Program("collectstatic", ("{python}", "manage.py", "collectstatic", "--noinput", "-v0")),
    Program("seed_demo", ("{python}", "manage.py", "seed_demo")),
]

STOP_TIMEOUT = 15.0  # seconds a child gets to stop before SIGKILL (gunicorn: 10 s grace)
MAX_BACKOFF = 30.0
# Restarts of an embedded server in a row (each failed, or dead again within a
# minute) before the run gives up: 1 + 2 + 4 + 8 + 16 s of backoff.
SERVER_RESTARTS = 5


def host_name(environ: Mapping[str, str] | None = None) -> str:
    """Return this host's name: SHOP_HOST_NAME, or the machine's short hostname."""
    environ = os.environ if environ is None else environ
    return environ.get("SHOP_HOST_NAME") or socket.gethostname().split(".")[0] or "localhost"


def context() -> dict[str, str]:
    """Return the values of the placeholders in PROGRAMS and SETUP."""
    return {
        "python": sys.executable,
        "host": os.environ.get("HOST", "127.0.0.1"),
        "port": os.environ.get("PORT", "8000"),
        "var": str(var_dir()),
        "run": str(run_dir_for(var_dir())),
        "web_workers": os.environ.get("WEB_CONCURRENCY", "2"),
        "web_threads": os.environ.get("WEB_THREADS", "8"),
        "worker_concurrency": os.environ.get("WORKER_CONCURRENCY", "2"),
        "host_name": host_name(),
        "sim_port": os.environ.get("SIMULATOR_PORT", "8470"),
    }


def _names(value: str) -> list[str]:
    return [name.strip() for name in value.split(",") if name.strip()]


def select_programs(
    environ: Mapping[str, str], table: list[Program] | None = None
) -> list[Program]:
    """Return the programs this host runs: SHOP_PROGRAMS of the table, workers multiplied.

    SHOP_PROGRAMS is a comma list of names (unset or empty: all); `worker`
    means every worker, `worker-2` one of them. SHOP_WORKERS (default 1)
    worker programs are named worker-1 ... worker-N. An unknown name, or a
    SHOP_WORKERS that is not a positive number, stops the run.
    """
    table = PROGRAMS if table is None else table
    try:
        workers = int(environ.get("SHOP_WORKERS") or "1")
    except ValueError:
        workers = 0
    if workers < 1:
        raise SystemExit(
            f"run: SHOP_WORKERS must be a number of at least 1, not {environ.get('SHOP_WORKERS')!r}"
        )
    expanded: list[Program] = []
    for program in table:
        if program.name != "worker":
            expanded.append(program)
            continue
        for n in range(1, workers + 1):
            name = f"worker-{n}"
            argv = tuple(part.replace("{worker}", name) for part in program.argv)
            expanded.append(Program(name, argv, program.env))
    wanted = _names(environ.get("SHOP_PROGRAMS", ""))
    if not wanted:
        return expanded
    known = {program.name for program in expanded}
    unknown = [name for name in wanted if name not in known and name != "worker"]
    if unknown:
        raise SystemExit(
            f"run: SHOP_PROGRAMS names unknown programs {', '.join(unknown)}"
            f" (known: {', '.join(['worker', *sorted(known)])})"
        )
    return [
        program
        for program in expanded
        if program.name in wanted or ("worker" in wanted and program.name.startswith("worker-"))
    ]


def select_setup(environ: Mapping[str, str], steps: list[Program] | None = None) -> list[Program]:
    """Return the setup steps this host runs, in SETUP's order.

    SHOP_SETUP is a comma list of step names (unset: all; empty or `none`:
    none); SHOP_DEMO_DATA=0 drops seed_demo either way. An unknown name stops
    the run.
    """
    steps = SETUP if steps is None else steps
    chosen = steps
    if "SHOP_SETUP" in environ:
        wanted = [name for name in _names(environ["SHOP_SETUP"]) if name != "none"]
        known = {step.name for step in steps}
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise SystemExit(
                f"run: SHOP_SETUP names unknown steps {', '.join(unknown)}"
                f" (known: {', '.join(step.name for step in steps)})"
            )
        chosen = [step for step in steps if step.name in wanted]
    if environ.get("SHOP_DEMO_DATA", "1") == "0":
        chosen = [step for step in chosen if step.name != "seed_demo"]
    return chosen


def demo_wanted(environ: Mapping[str, str], *, embedded_database: bool) -> bool:
    """Demo data (users with known passwords) only where nobody else's data can be.

    On the embedded PostgreSQL of `var/` (a developer's own), or when asked
    with SHOP_DEMO=1; never by default on a DATABASE_URL that other hosts or
    real shoppers may share (`make run` sets nothing: this decides).
    """
    asked = environ.get("SHOP_DEMO", "")
    if asked in ("0", "1"):
        return asked == "1"
    return embedded_database


# Setup steps that need no lock: each host empties its own metrics folder.
LOCAL_STEPS = frozenset({"metrics-dir"})


def say(message: str) -> None:
    print(f"run: {message}", file=sys.stderr, flush=True)


class Stop(Exception):
    """A stop signal arrived (Ctrl-C, SIGTERM, SIGHUP)."""


class Signals:
    """Remember the first stop signal; the loops check it (no exceptions from handlers)."""

    def __init__(self) -> None:
        self.received: str | None = None
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name

    def check(self) -> None:
        if self.received is not None:
            raise Stop(self.received)


class Child:
    def __init__(self, program: Program, ctx: Mapping[str, str]) -> None:
        self.program = program
        self.argv = [part.format(**ctx) for part in program.argv]
        self.env = {key: value.format(**ctx) for key, value in program.env.items()}
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.backoff = 1.0
        self.restart_at: float | None = None

    @property
    def name(self) -> str:
        return self.program.name


class Supervisor:
    """Keep the programs running; stop them all, with their process groups, at the end."""

    def __init__(self, *, programs: list[Program], ctx: Mapping[str, str], env, state_file: Path):
        self.children = [Child(program, ctx) for program in programs]
        self.env = env
        self.state_file = state_file

    def spawn(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            child.argv,
            cwd=BASE_DIR,
            env={**self.env, **child.env},
            stdin=subprocess.DEVNULL,
            # Its own process group: Ctrl-C reaches only us, and we can stop
            # the child together with its workers.
            process_group=0,
            # SIGKILL when the supervisor dies, not SIGTERM: SIGTERM is a warm
            # shutdown for Celery, which waits for running tasks with no time
            # bound, so a worker that a SIGKILLed supervisor leaves behind
            # keeps running with its work. Every program is built
            # to be SIGKILLed at any moment (late acks redeliver, leases are
            # fenced, keys are taken over), and the orderly stop, whose SIGTERM
            # stop_all sends, is not what a killed supervisor can give anyway.
            # Their own children follow: Celery's pool children and
            # gunicorn's workers (gunicorn.conf.py) have SIGKILL as their
            # parent-death signal (docs/running.md, "Nothing left running").
            preexec_fn=die_with_parent(signal.SIGKILL),
        )
        child.started_at = time.monotonic()
        child.restart_at = None
        say(f"started {child.name} (pid {child.proc.pid})")
        self.save_state()

    def start_all(self) -> None:
        for child in self.children:
            self.spawn(child)

    def poll(self) -> None:
        """Restart children that exited, each after its own backoff."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is None:
                continue
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self.spawn(child)
                continue
            code = child.proc.poll()
            if code is None:
                continue
            # Its workers may outlive it; they go before the new one starts.
            stop_group(child.proc.pid, timeout=5)
            if now - child.started_at > 60:
                child.backoff = 1.0
            say(f"{child.name} exited with code {code}; restarting in {child.backoff:.0f} s")
            child.restart_at = now + child.backoff
            child.backoff = min(child.backoff * 2, MAX_BACKOFF)

    def stop_all(self) -> None:
        running = [c for c in self.children if c.proc is not None]
        # Each leader stops its own workers gracefully; all stop in parallel.
        for child in running:
            assert child.proc is not None  # running
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for child in running:
            assert child.proc is not None  # running
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                say(f"{child.name} did not stop within {STOP_TIMEOUT:.0f} s; killing it")
            # Whatever is left of its group (or the leader itself, on timeout).
            stop_group(child.proc.pid, sig=signal.SIGKILL, timeout=5)
            child.proc.wait()
            say(f"stopped {child.name}")
        self.state_file.unlink(missing_ok=True)

    def save_state(self) -> None:
        children = []
        for child in self.children:
            if child.proc is None:
                continue
            try:
                created = psutil.Process(child.proc.pid).create_time()
            except psutil.NoSuchProcess:
                continue
            children.append({"name": child.name, "pid": child.proc.pid, "create_time": created})
        state = {"pid": os.getpid(), "children": children}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_file)


class ServerRestarts:
    """Restart the embedded servers that die, each after its own backoff.

    The clients (web, worker, beat) keep their URLs, which a restart keeps
    (same socket, same port), and reconnect by themselves; `/healthz`
    answers 503 meanwhile. A server that keeps failing ends the run.
    """

    def __init__(self, services: EmbeddedServices) -> None:
        self.services = services
        self.restart_at: dict[str, float] = {}
        self.backoff: dict[str, float] = {}
        self.failures: dict[str, int] = {}
        self.restarted_at: dict[str, float] = {}

    def poll(self) -> bool:
        """Restart what died once its backoff passed; return False when giving up."""
        for server in self.services.started:
            name, now = server.name, time.monotonic()
            if server.running():
                if name in self.restarted_at and now - self.restarted_at[name] > 60:
                    # Up for a minute since its restart: a later death starts afresh.
                    for record in (self.restarted_at, self.backoff, self.failures):
                        record.pop(name, None)
                continue
            if name not in self.restart_at:
                failures = self.failures.get(name, 0)
                if failures >= SERVER_RESTARTS:
                    say(f"embedded {name} keeps dying ({failures} restarts); giving up")
                    return False
                backoff = self.backoff.get(name, 1.0)
                say(f"embedded {name} stopped unexpectedly; restarting in {backoff:.0f} s")
                self.restart_at[name] = now + backoff
                self.backoff[name] = min(backoff * 2, MAX_BACKOFF)
                self.failures[name] = failures + 1
                continue
            if now < self.restart_at[name]:
                continue
            del self.restart_at[name]
            try:
                server.restart()
            except (RuntimeError, OSError, ServerBusy) as exc:
                # Still not running: the next poll schedules another try.
                say(f"restarting embedded {name} failed: {exc}")
                continue
            self.restarted_at[name] = time.monotonic()
            say(f"restarted embedded {name}")
        return True


def clear_leftovers(state_file: Path) -> None:
    """Stop the process groups a killed supervisor left (recorded in its state file)."""
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError):
        state_file.unlink(missing_ok=True)
        return
    for entry in state.get("children", []):
        pid = entry["pid"]
        try:
            same = abs(psutil.Process(pid).create_time() - entry["create_time"]) < 0.01
        except psutil.NoSuchProcess:
            # The leader is gone; a group with its id can only hold its own workers.
            same = True
        if same and group_alive(pid):
            say(f"stopping {entry['name']} left by a killed run (pid {pid})")
            stop_leader_then_group(pid, timeout=STOP_TIMEOUT)
    state_file.unlink(missing_ok=True)


def acquire_lock(run_dir: Path) -> int:
    """Hold the supervisor lock of this data folder for our lifetime; exit if it is taken."""
    fd = os.open(run_dir / "supervisor.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say(f"the shop is already running for {var_dir()}; stop it first")
        raise SystemExit(1) from None
    return fd


def run_setup(steps: list[Program], ctx: Mapping[str, str], env, signals: Signals) -> None:
    """Run the setup steps in order; those on the shared database under the setup lock."""
    local = [step for step in steps if step.name in LOCAL_STEPS]
    shared = [step for step in steps if step.name not in LOCAL_STEPS]
    for step in local:
        run_step(step, ctx, env, signals)
    if not shared:
        return
    with setup_lock(env["DATABASE_URL"], check=signals.check, say=say):
        for step in shared:
            run_step(step, ctx, env, signals)


def run_step(step: Program, ctx: Mapping[str, str], env, signals: Signals) -> None:
    argv = [part.format(**ctx) for part in step.argv]
    say(f"{step.name}: {' '.join(argv[1:])}")
    proc = subprocess.Popen(
        argv,
        cwd=BASE_DIR,
        env=env,
        stdin=subprocess.DEVNULL,
        process_group=0,
        preexec_fn=die_with_parent(signal.SIGTERM),
    )
    while (code := proc.poll()) is None:
        if signals.received is not None:
            stop_leader_then_group(proc.pid, timeout=STOP_TIMEOUT)
            proc.wait()
            signals.check()
        time.sleep(0.1)
    if code != 0:
        raise SystemExit(f"run: {step.name} failed with code {code}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> int:
    # Before anything reads the environment: a DATABASE_URL in .env means no
    # embedded PostgreSQL, a PORT there is the port to check.
    load_env_file()
    ctx = context()
    programs = select_programs(os.environ)
    steps = select_setup(os.environ)
    names = {program.name for program in programs}
    var = var_dir()
    var.mkdir(parents=True, exist_ok=True)
    run_dir = ensure_owned_dir(run_dir_for(var))
    lock = acquire_lock(run_dir)
    state_file = run_dir / "supervisor.json"
    signals = Signals()
    services = EmbeddedServices(root=var, durable=True)
    supervisor: Supervisor | None = None
    code = 0
    try:
        clear_leftovers(state_file)
        urls = services.start()
        signals.check()
        for name, url in urls.items():
            say(f"embedded {name}={url}")
        # `manage.py` from the checkout finds them here (runner/manage.py).
        publish(run_dir, urls)
        env = {**os.environ, **urls, "PYTHONUNBUFFERED": "1"}
        env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
        # In every child's logs (core/logging.py) and worker node names.
        env["SHOP_HOST_NAME"] = ctx["host_name"]
        for name, value in ENV.items():
            env.setdefault(name, value.format(**ctx))
        say(f"host {ctx['host_name']}: {', '.join(program.name for program in programs)}")
        if "EMAIL_URL" not in os.environ:
            say(f"sent mail is written to {var}/mail/ (one file per message)")
        if "payments-simulator" not in names and "PAYMENTS_PROVIDER_URL" not in os.environ:
            say("no payments-simulator here and no PAYMENTS_PROVIDER_URL: set it to the provider")
        # The provider's webhooks: one secret per install, shared with the simulator.
        print(webhook_env(var=var, environ=env, host=ctx["host"], port=ctx["port"]), flush=True)
        if "PAYMENTS_WEBHOOK_SECRET" not in os.environ and "DATABASE_URL" not in urls:
            # A database of its own is shared with other hosts: their secrets must match.
            say("PAYMENTS_WEBHOOK_SECRET not set: this host made its own; set one on every host")
        if "web" in names and not port_is_free(int(ctx["port"]), ctx["host"]):
            say(f"port {ctx['port']} is in use; choose another with PORT=...")
            return 1
        if any(step.name == "seed_demo" for step in steps):
            if demo_wanted(os.environ, embedded_database="DATABASE_URL" in urls):
                env["SHOP_DEMO"] = "1"  # the seed_demo command's own guard
            else:
                steps = [step for step in steps if step.name != "seed_demo"]
                say("no demo data: DATABASE_URL is not embedded (SHOP_DEMO=1 to seed it)")
        run_setup(steps, ctx, env, signals)
        supervisor = Supervisor(programs=programs, ctx=ctx, env=env, state_file=state_file)
        supervisor.start_all()
        restarts = ServerRestarts(services)
        base = f"http://{ctx['host']}:{ctx['port']}"
        announced = False
        while True:
            signals.check()
            supervisor.poll()
            if not restarts.poll():
                code = 1
                break
            if not announced and "web" not in names:
                announced = True
                say("the programs are running (no web on this host); press Ctrl-C to stop")
            if not announced and healthy(f"{base}/healthz"):
                announced = True
                say(f"the shop is running at {base}/  (API {base}/api/docs/, admin {base}/admin/)")
                say("press Ctrl-C to stop")
            time.sleep(0.2)
    except Stop as stop:
        say(f"{stop.args[0]}: stopping")
    except ServerBusy as busy:
        say(f"{busy}: a manage.py command may be using it; start again when it ends")
        code = 1
    finally:
        if supervisor is not None:
            supervisor.stop_all()
        (run_dir / PUBLISHED).unlink(missing_ok=True)
        services.stop()
        state_file.unlink(missing_ok=True)
        os.close(lock)
        say("stopped")
    return code
