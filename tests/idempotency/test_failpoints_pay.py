"""The failpoint spec the payments tests rely on (interfaces.md), checked in real processes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from idempotency.failpoints import FailpointError, failpoint

ROOT = Path(__file__).resolve().parents[2]
HIT = "from idempotency.failpoints import failpoint; failpoint('x.y'); print('survived')"


def run(env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SHOP_FAILPOINTS")}
    return subprocess.run(
        [sys.executable, "-c", HIT],
        cwd=ROOT,
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_inert_without_the_variable(monkeypatch):
    monkeypatch.delenv("SHOP_FAILPOINTS", raising=False)
    failpoint("x.y")


def test_raise_and_other_names(monkeypatch):
    monkeypatch.setenv("SHOP_FAILPOINTS", "x.y=raise,a.b=sleep:1")
    failpoint("a.b")
    failpoint("not.listed")
    with pytest.raises(FailpointError):
        failpoint("x.y")


def test_exit_kills_the_process_without_cleanup():
    result = run({"SHOP_FAILPOINTS": "x.y=exit"})
    assert result.returncode == 1
    assert "survived" not in result.stdout


def test_exit_at_n_counts_across_processes(tmp_path):
    env = {"SHOP_FAILPOINTS": "x.y=exit@2", "SHOP_FAILPOINTS_DIR": str(tmp_path)}
    assert [run(env).returncode for _ in range(3)] == [1, 1, 0]
