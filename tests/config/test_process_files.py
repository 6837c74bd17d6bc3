"""The production process files (Procfile, deploy/systemd/*.service) work as they are.

Each command is parsed out of its file, checked to name an existing program
(the venv's python, an importable module, a Django command) under production
settings, then started under those settings against the test database for a
few seconds: the web answers /healthz, the others print their start line and
are still running (docs/deployment.md, "Production processes").
"""

from __future__ import annotations

import configparser
import contextlib
import importlib.util
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from tests.support.servers import server_env

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
PRODUCTION = "DJANGO_SETTINGS_MODULE=config.settings.production"


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    entries = [line.split(":", 1) for line in lines if line.strip() and not line.startswith("#")]
    return {name.strip(): command.strip() for name, command in entries}


def unit(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep ExecStart's case
    parser.read(path)
    return parser["Service"]


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """Split `A=b python -m x ...` into its leading assignments and the argv."""
    words = shlex.split(command)
    assignments: dict[str, str] = {}
    while words and "=" in words[0] and not words[0].startswith(("-", "/")):
        name, value = words.pop(0).split("=", 1)
        assignments[name] = value
    return assignments, words


def _check_program(argv: list[str]) -> None:
    assert Path(argv[0]).name == "python", argv  # the venv's python, nothing else
    if argv[1] == "-m":
        assert importlib.util.find_spec(argv[2]) is not None, argv
    else:
        from django.core.management import get_commands

        assert argv[1] == "manage.py" and argv[2] in get_commands(), argv


def test_every_procfile_command_runs_a_real_program_under_production_settings():
    entries = procfile()
    assert {"web", "beat", "relay", "release"} <= set(entries)
    for command in entries.values():
        assignments, argv = _argv(command)
        assert assignments.get("DJANGO_SETTINGS_MODULE") == "config.settings.production"
        _check_program(argv)


def _queues_of(argv: list[str]) -> list[str]:
    """The queues a worker command names with `--queues` / `-Q`."""
    for flag in ("--queues", "-Q"):
        if flag in argv:
            return argv[argv.index(flag) + 1].split(",")
    return []


def test_the_procfile_runs_one_worker_per_queue_each_with_its_own_node_name():
    workers = {name: _argv(cmd)[1] for name, cmd in procfile().items() if "worker" in cmd}
    assert sorted(workers) == sorted(f"worker-{queue}" for queue in settings.SHOP_QUEUES)
    for name, argv in workers.items():
        queue = name.removeprefix("worker-")
        assert _queues_of(argv) == [queue], name
        assert argv[argv.index("--hostname") + 1] == f"{queue}@%h", name


def test_the_systemd_worker_is_a_template_whose_instance_is_the_queue():
    (template,) = [path for path in UNITS if "worker" in path.name]
    assert template.name == "shop-worker@.service"
    _, argv = _argv(unit(template)["ExecStart"])
    assert _queues_of(argv) == ["%i"]
    assert argv[argv.index("--hostname") + 1] == "%i@%%h"  # systemd's %% is celery's %
    # docs/deployment.md enables one instance per queue, each named in it.
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    for queue in settings.SHOP_QUEUES:
        assert f"shop-worker@{queue}" in deployment, queue


def test_every_systemd_unit_runs_a_real_program_under_production_settings():
    names = {path.stem for path in UNITS}
    assert {"shop-web", "shop-worker@", "shop-beat", "shop-relay"} <= names
    for path in UNITS:
        service = unit(path)
        assert service["Environment"] == PRODUCTION, path
        assert service["EnvironmentFile"] == "/etc/shop/shop.env"
        for key in ("ExecStartPre", "ExecStart"):
            if key in service:
                _, argv = _argv(service[key])
                assert argv[0] == "/srv/shop/.venv/bin/python", path
                _check_program(argv)


def test_migrations_run_once_in_the_release_unit_that_every_process_follows():
    """One oneshot unit collects static files and migrates (`release`, under the release
    lock); the long-running units require it and start after it, and none of them
    migrates at its own start; the Procfile's release line migrates the same way."""
    release = ROOT / "deploy" / "systemd" / "shop-release.service"
    service = unit(release)
    assert service["Type"] == "oneshot" and service["RemainAfterExit"] == "yes"
    assert _argv(service["ExecStart"])[1][1:3] == ["manage.py", "release"]  # migrate, locked
    assert _argv(service["ExecStartPre"])[1][1:3] == ["manage.py", "collectstatic"]
    for path in UNITS:
        if path == release:
            continue
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read(path)
        assert "shop-release.service" in parser["Unit"]["Requires"].split(), path
        assert "shop-release.service" in parser["Unit"]["After"].split(), path
        commands = [parser["Service"].get(key, "") for key in ("ExecStartPre", "ExecStart")]
        assert not any("migrate" in command for command in commands), path
    assert _argv(procfile()["release"])[1][1:3] == ["manage.py", "release"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _production_env(port: int) -> dict[str, str]:
    env = server_env()
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        SECRET_KEY="process-files-test-" + "x" * 50,
        PAYMENTS_WEBHOOK_SECRET="whsec_process_files_test",
        PAYMENTS_PROVIDER_URL="https://provider.example.com",
        ALLOWED_HOSTS="127.0.0.1,localhost",
        SHOP_ENV_FILE=os.devnull,
        PORT=str(port),
        SECURE_SSL_REDIRECT="false",
    )
    return env


def _localise(argv: list[str], tmp_path: Path) -> list[str]:
    """The file's paths on this checkout: the venv's python, a temporary state folder."""
    out = []
    for word in argv:
        word = word.replace("%%", "%")  # systemd's escape for a literal % (celery's %h)
        # The file's own state folders only, before the venv's path comes in: a
        # checkout under /tmp/ has a python under /tmp/ too.
        for state in ("/var/lib/shop/", "/tmp/"):
            if word.startswith(state):
                word = f"{tmp_path}/{word.removeprefix(state)}"
                break
        word = word.replace("/srv/shop/.venv/bin/python", sys.executable)
        out.append(sys.executable if word == "python" else word)
    return out


@contextlib.contextmanager
def _started(argv: list[str], env: dict[str, str], log: Path):
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def _wait_for(proc, log: Path, done, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{text[-3000:]}"
        if done(text):
            return
        time.sleep(0.3)
    raise AssertionError(f"not started within {timeout} s:\n{log.read_text()[-3000:]}")


def _answers(port: int):
    def check(_text: str) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    return check


STARTED = {
    "worker": lambda text: " ready." in text,
    "beat": lambda text: "beat: Starting" in text,
    "relay": lambda text: "relay " in text and " started" in text,
}


def _commands() -> list[tuple[str, str]]:
    found = [(f"Procfile:{name}", cmd) for name, cmd in procfile().items() if name != "release"]
    for path in UNITS:
        if unit(path).get("Type") == "oneshot":
            continue  # the release step runs and exits, like the Procfile's release
        command = unit(path)["ExecStart"]
        if path.name.endswith("@.service"):
            # A template: started as one instance (the Procfile starts every queue).
            instance = next(iter(settings.SHOP_QUEUES))
            found.append((path.name.replace("@", f"@{instance}"), command.replace("%i", instance)))
        else:
            found.append((path.name, command))
    return found


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("where", "command"), _commands(), ids=lambda value: value.split(" ")[0])
def test_each_process_starts_under_production_settings(where, command, tmp_path):
    port = _free_port()
    _, argv = _argv(command.replace("$PORT", str(port)))
    argv = _localise(argv, tmp_path)
    if "--bind" in argv:
        argv[argv.index("--bind") + 1] = f"127.0.0.1:{port}"
    kind = next(
        (
            kind
            for kind in ("gunicorn", "worker", "beat", "relay")
            if kind in argv or "relay_outbox" in argv and kind == "relay"
        ),
        None,
    )
    assert kind is not None, where
    log = tmp_path / "out.log"
    with _started(argv, _production_env(port), log) as proc:
        _wait_for(proc, log, _answers(port) if kind == "gunicorn" else STARTED[kind])
        assert "Traceback" not in log.read_text(errors="replace")
        if kind == "worker":
            # It consumes its queue and no other (the banner's [queues] section).
            banner = re.findall(r"^\s+\.> (\S+)\s+exchange=", log.read_text(), re.MULTILINE)
            assert banner == _queues_of(argv), banner
            # The worker health check of docs/deployment.md answers for this node.
            node = argv[argv.index("--hostname") + 1] if "--hostname" in argv else "celery@%h"
            node = node.replace("%h", socket.gethostname())
            assert worker_health(node, _production_env(port)).returncode == 0
            # A node that is not there gets no answer: failed once its timeout runs out
            # (1 s here; the documented 5 s is for a loaded worker's answer).
            assert worker_health("nobody@nowhere", _production_env(port), timeout=1).returncode != 0


def worker_health(
    node: str, env: dict[str, str], *, timeout: int = 5
) -> subprocess.CompletedProcess:
    """docs/deployment.md's worker health check: `celery inspect ping` for one node."""
    return subprocess.run(
        [sys.executable, "-m", "celery", "--app", "config.celery:app", "inspect", "ping",
         "--destination", node, "--timeout", str(timeout)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
