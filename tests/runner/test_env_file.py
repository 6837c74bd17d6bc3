"""The `.env` file: read by the runner as the settings read it; the environment wins."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import runner
from runner import read_env_file
from tests.runner.conftest import ROOT

SAMPLE = r"""# comment
DATABASE_URL=postgres://u:p@h:5432/d
export REDIS_URL=redis://127.0.0.1:6390/1
SINGLE='a "quoted" # value'
DOUBLE="line\nnext \"q\" \\ end"
HASH=abc#def
EMPTY=
 SPACED=ignored
NOT A LINE
WITH_EQUALS=a=b=c
INTERPOLATED=${HASH}
"""


def test_the_runner_reads_a_file_as_the_settings_do(tmp_path):
    """One parser, python-dotenv, with the same options in the runner and the settings."""
    path = tmp_path / "sample.env"
    path.write_text(SAMPLE)
    ours = read_env_file(path)
    names = sorted({*ours, "SPACED", "NOT"})
    env = {k: v for k, v in os.environ.items() if k not in names and k != "DATABASE_URL"}
    env.update(SHOP_ENV_FILE=str(path))
    script = (
        "import json, os, sys; import config.settings.environment; "
        "print(json.dumps({k: os.environ[k] for k in sys.argv[1:] if k in os.environ}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *names, "DATABASE_URL"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert ours == json.loads(done.stdout)
    assert ours["DATABASE_URL"] == "postgres://u:p@h:5432/d"
    assert ours["REDIS_URL"] == "redis://127.0.0.1:6390/1"
    assert ours["SINGLE"] == 'a "quoted" # value'
    assert ours["DOUBLE"] == 'line\nnext "q" \\ end'
    assert ours["HASH"] == "abc#def"
    assert ours["WITH_EQUALS"] == "a=b=c"
    assert ours["EMPTY"] == ""
    assert ours["INTERPOLATED"] == "${HASH}"


def test_no_file_is_no_variables(tmp_path):
    assert read_env_file(tmp_path / "missing.env") == {}


def test_load_keeps_what_the_environment_sets(tmp_path, monkeypatch):
    path = tmp_path / "shop.env"
    path.write_text("SHOP_T_A=file\nSHOP_T_B=file\n")
    monkeypatch.setenv("SHOP_ENV_FILE", str(path))
    monkeypatch.setenv("SHOP_T_A", "environment")
    monkeypatch.delenv("SHOP_T_B", raising=False)
    runner.load_env_file()
    assert os.environ["SHOP_T_A"] == "environment"
    assert os.environ["SHOP_T_B"] == "file"
    monkeypatch.delenv("SHOP_T_B")


def test_default_file_is_dot_env_in_the_checkout(monkeypatch):
    monkeypatch.delenv("SHOP_ENV_FILE", raising=False)
    assert runner.env_file() == ROOT / ".env"


def test_the_run_command_reads_env_before_it_decides_what_to_embed(tmp_path):
    """URLs and PORT from .env: nothing embedded, and the port checked is the file's."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = tmp_path / "shop.env"
        # Unreachable servers: with both URLs set nothing connects before the port check.
        path.write_text(
            f"DATABASE_URL=postgres://nobody@127.0.0.1:1/none\n"
            f"REDIS_URL=redis://127.0.0.1:1/0\nPORT={port}\n"
        )
        env = {
            k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "PORT")
        }
        env.update(SHOP_ENV_FILE=str(path), SHOP_VAR_DIR=str(tmp_path / "var"))
        result = subprocess.run(
            [sys.executable, "-m", "runner"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr
    assert f"port {port} is in use" in result.stderr
    assert "embedded" not in result.stderr
    assert not (tmp_path / "var" / "postgres").exists()
    assert not (tmp_path / "var" / "redis").exists()
