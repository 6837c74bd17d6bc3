"""A test session without DATABASE_URL / REDIS_URL runs on embedded servers and leaves nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from runner.processes import run_dir_for
from tests.runner.conftest import ROOT, embedded_env, leftovers, sockets_under, wait_for

pytestmark = [pytest.mark.embedded, pytest.mark.slow]

INNER = """
import os
import pathlib
import time

import psycopg
import pytest
import redis


# Skipped before its database fixture runs: that session's database server
# is the outer session's, whose test database must not be recreated.
@pytest.mark.skipif(bool(os.environ.get("EXPECTED_DATABASE_URL")), reason="env file session")
@pytest.mark.django_db
def test_runs_on_the_embedded_servers():
    from django.conf import settings
    from django.db import connection

    assert os.environ["DATABASE_URL"].startswith("postgres://postgres@/shop?host=")
    assert connection.settings_dict["NAME"] == "test_shop"  # made by pytest-django inside
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM inventory_product")
    assert redis.Redis.from_url(settings.CELERY_BROKER_URL).ping()


def test_uses_the_env_file_urls():
    if not os.environ.get("EXPECTED_DATABASE_URL"):
        pytest.skip("only with an env file")
    from django.conf import settings

    assert os.environ["DATABASE_URL"] == os.environ["EXPECTED_DATABASE_URL"]
    assert settings.CELERY_BROKER_URL == os.environ["EXPECTED_REDIS_URL"]


def test_blocks_until_killed():
    if not os.environ.get("INNER_BLOCK"):
        pytest.skip("only when asked to block")
    pathlib.Path(os.environ["INNER_BLOCK"]).write_text("started")
    time.sleep(600)
"""


def _session(tmp, env, **kwargs):
    inner = tmp / "inner"
    inner.mkdir(exist_ok=True)
    (inner / "test_inner.py").write_text(textwrap.dedent(INNER))
    argv = [sys.executable, "-m", "pytest", str(inner), "-p", "no:cacheprovider"]
    argv += ["--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml")]
    # SIGINT at its default even when this run was started in the background
    # by a shell without job control (which ignores it, and Python then
    # installs no KeyboardInterrupt handler): the tests send the inner one Ctrl-C.
    return subprocess.Popen(argv, cwd=ROOT, env=env, preexec_fn=_default_sigint, **kwargs)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_session_starts_the_servers_once_and_stops_them(short_tmp, marker):
    var = short_tmp / "var"
    session = _session(
        short_tmp,
        embedded_env(marker=marker, var=var),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = session.communicate(timeout=240)
    assert session.returncode == 0, out
    assert "1 passed, 2 skipped" in out
    assert "embedded services: EmbeddedPostgres, EmbeddedRedis" in out
    assert leftovers(marker=marker, under=var) == []
    assert sockets_under(run_dir_for(var / "test")) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_interrupted_session_leaves_nothing_running(short_tmp, marker, sig):
    var = short_tmp / "var"
    started = short_tmp / "started"
    session = _session(
        short_tmp,
        embedded_env(marker=marker, var=var, INNER_BLOCK=str(started)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(started.exists, timeout=240, message="the inner session never started")
        assert leftovers(under=var), "the embedded servers should be running now"
        session.send_signal(sig)
        session.wait(timeout=180)  # a loaded CI machine: seen over 60 s
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    if sig == signal.SIGINT:
        # pytest ends the session: the plugin stops the servers before exiting.
        assert leftovers(marker=marker, under=var) == []
    else:
        # No cleanup code runs; the kernel's parent-death signal stops them.
        wait_for(
            lambda: not leftovers(marker=marker, under=var),
            timeout=30,
            message="embedded servers outlived the killed session",
        )
    assert sockets_under(run_dir_for(var / "test")) == []


def test_a_second_session_of_the_checkout_gets_servers_of_its_own(short_tmp, marker):
    """var/test is taken by a running session: the next one uses a throwaway folder."""
    var = short_tmp / "var"
    started = short_tmp / "started"
    first = _session(
        short_tmp,
        embedded_env(marker=marker, var=var, INNER_BLOCK=str(started)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(started.exists, timeout=240, message="the first session never started")
        second = _session(
            short_tmp,
            embedded_env(marker=marker, var=var),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        out, _ = second.communicate(timeout=240)
        assert second.returncode == 0, out
        assert f"in {var}/test-" in out  # the report header names the throwaway folder
        assert sorted(p.name for p in var.iterdir()) == ["test"]  # and it is gone
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=180)  # a loaded CI machine: seen over 60 s
    assert leftovers(marker=marker, under=var) == []


def test_urls_in_the_env_file_mean_nothing_is_embedded(short_tmp, marker):
    """The session's own servers (the outer session's URLs), named only in an env file."""
    var = short_tmp / "var"
    env_file = short_tmp / "shop.env"
    env_file.write_text(
        f"DATABASE_URL={os.environ['DATABASE_URL']}\nREDIS_URL={os.environ['REDIS_URL']}\n"
    )
    env = embedded_env(
        marker=marker,
        var=var,
        SHOP_ENV_FILE=str(env_file),
        EXPECTED_DATABASE_URL=os.environ["DATABASE_URL"],
        EXPECTED_REDIS_URL=os.environ["REDIS_URL"],
    )
    session = _session(short_tmp, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = session.communicate(timeout=240)
    assert session.returncode == 0, out
    assert "1 passed, 2 skipped" in out
    assert "embedded services" not in out
    assert not (var / "test").exists()
