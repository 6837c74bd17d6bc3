"""`manage.py` from the checkout reaches the shop's servers (contract: "Management commands")."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from runner import manage
from runner.processes import free_port, run_dir_for
from tests.runner.conftest import (
    ROOT,
    embedded_env,
    leftovers,
    sockets_under,
    start_run,
    wait_up,
)

SHOW = (
    "import os; from django.contrib.auth.models import User; "
    "print(os.environ['DATABASE_URL'], os.environ['REDIS_URL'], "
    "sorted(User.objects.filter(is_superuser=True).values_list('username', flat=True)))"
)


def _manage(env: dict, *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _printed(result: subprocess.CompletedProcess) -> str:
    """The last line `shell -c` printed (Django's shell reports its auto-imports first)."""
    return _ok(result).stdout.strip().splitlines()[-1]


def _superuser(env: dict, name: str) -> subprocess.CompletedProcess:
    return _ok(
        _manage(
            env,
            "createsuperuser",
            "--noinput",
            DJANGO_SUPERUSER_USERNAME=name,
            DJANGO_SUPERUSER_EMAIL=f"{name}@example.com",
            DJANGO_SUPERUSER_PASSWORD=f"{name}-long-password",
        )
    )


@pytest.mark.embedded
@pytest.mark.slow
def test_manage_py_uses_make_runs_servers_and_starts_them_when_it_is_not_up(short_tmp, marker):
    var = short_tmp / "var"
    port = free_port()
    env = embedded_env(marker=marker, var=var)
    log_path = short_tmp / "run.log"

    # 1. While `make run` is up: its servers, nothing started.
    with open(log_path, "wb") as log:
        run = start_run({**env, "PORT": str(port), "WEB_CONCURRENCY": "1"}, log)
    try:
        wait_up(f"http://127.0.0.1:{port}", run, log_path)
        announced = dict(re.findall(r"run: embedded (\w+)=(\S+)", log_path.read_text()))
        created = _superuser(env, "boss")
        assert "started the embedded" not in created.stderr
        shown = _printed(_manage(env, "shell", "-c", SHOW))
        assert shown.split()[:2] == [announced["DATABASE_URL"], announced["REDIS_URL"]]
        assert "'boss'" in shown and "'staff'" in shown  # seed_demo's, too
        # dbshell: psql gets the socket folder.
        query = "select count(*) from auth_user where username = 'boss'"
        assert _ok(_manage(env, "dbshell", "--", "-tAc", query)).stdout.strip() == "1"
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=90) == 0, log_path.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert leftovers(marker=marker, under=var) == []

    # 2. `make run` is not up: the same data, on servers started for each command.
    created = _superuser(env, "chief")
    assert "started the embedded PostgreSQL and Redis" in created.stderr
    shown = _manage(env, "shell", "-c", SHOW)
    assert "started the embedded PostgreSQL and Redis" in shown.stderr
    assert "'boss', 'chief'" in _printed(shown)
    assert _printed(shown).split()[0] == announced["DATABASE_URL"]  # the same socket folder
    query = "select count(*) from auth_user where username = 'chief'"
    assert _ok(_manage(env, "dbshell", "--", "-tAc", query)).stdout.strip() == "1"
    # ... and stopped when each command ends.
    assert leftovers(marker=marker, under=var) == []
    assert sockets_under(run_dir_for(var)) == []


def test_manage_py_with_urls_set_starts_nothing(tmp_path):
    env = {**os.environ, "SHOP_VAR_DIR": str(tmp_path / "var"), "SHOP_ENV_FILE": os.devnull}
    shown = _manage(env, "shell", "-c", "import os; print(os.environ['DATABASE_URL'])")
    assert _printed(shown) == os.environ["DATABASE_URL"]
    assert "started" not in shown.stderr
    assert not (tmp_path / "var").exists()


def test_manage_py_takes_urls_from_the_env_file(tmp_path):
    env_file = tmp_path / "shop.env"
    env_file.write_text(
        f"DATABASE_URL={os.environ['DATABASE_URL']}\nREDIS_URL={os.environ['REDIS_URL']}\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in manage.NAMES}
    env.update(SHOP_VAR_DIR=str(tmp_path / "var"), SHOP_ENV_FILE=str(env_file))
    shown = _manage(env, "shell", "-c", "import os; print(os.environ['REDIS_URL'])")
    assert _printed(shown) == os.environ["REDIS_URL"]
    assert not (tmp_path / "var").exists()


def test_a_live_run_publishes_its_urls_and_a_dead_ones_file_is_ignored(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manage.publish(run_dir, {"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert manage.published(run_dir) == {"REDIS_URL": "redis://127.0.0.1:1/0"}
    assert (run_dir / manage.PUBLISHED).stat().st_mode & 0o777 == 0o600

    # This process stands for a run that embeds Redis only: its DATABASE_URL
    # came from its own environment, which a command here cannot guess.
    monkeypatch.setattr(manage, "run_dir_for", lambda var: run_dir)
    monkeypatch.setenv("SHOP_ENV_FILE", os.devnull)
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.delenv("REDIS_URL")
    with pytest.raises(SystemExit, match="takes DATABASE_URL from its environment"):
        with manage.servers_for_command():
            pass

    state = (run_dir / manage.PUBLISHED).read_text()
    (run_dir / manage.PUBLISHED).write_text(state.replace('"create_time": ', '"create_time": 1'))
    assert manage.published(run_dir) is None


@pytest.mark.parametrize("command", ["makemessages", "compilemessages", "help", "--version"])
def test_the_catalogue_commands_and_help_need_no_server(command):
    """`make messages` runs with no server (tests/shop/test_catalogue.py runs it so)."""
    assert not manage.needs_servers(["manage.py", command])
    assert not manage.needs_servers(["manage.py"])  # Django's help


@pytest.mark.parametrize("command", ["migrate", "shell", "makemigrations", "createsuperuser"])
def test_the_other_commands_get_their_servers(command):
    assert manage.needs_servers(["manage.py", command])


def test_a_serverless_command_starts_nothing_with_no_url_set(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in manage.NAMES}
    env.update(SHOP_VAR_DIR=str(tmp_path / "var"), SHOP_ENV_FILE=os.devnull)
    shown = _ok(_manage(env, "help", "compilemessages"))
    assert "started" not in shown.stderr and "compilemessages" in shown.stdout
    assert not (tmp_path / "var").exists()
