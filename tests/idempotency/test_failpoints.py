"""Failpoints: inert by default; raise, exit, sleep; @N counted across real processes."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from idempotency import failpoints
from idempotency.failpoints import FailpointConfigError, FailpointError, failpoint, parse

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fp_env(monkeypatch, tmp_path):
    monkeypatch.setenv(failpoints.ENV_DIR, str(tmp_path / "fp"))

    def set_spec(spec: str) -> None:
        monkeypatch.setenv(failpoints.ENV_SPEC, spec)

    return set_spec


def test_inert_without_environment(monkeypatch):
    monkeypatch.delenv(failpoints.ENV_SPEC, raising=False)
    failpoint("anything.at.all")


def test_parse_actions():
    actions = parse("a=raise, b=exit@2,c=sleep:250@1,d=off")
    assert actions["a"] == failpoints.Action(kind="raise")
    assert actions["b"] == failpoints.Action(kind="exit", limit=2)
    assert actions["c"] == failpoints.Action(kind="sleep", sleep_ms=250, limit=1)
    assert actions["d"].kind == "off"


@pytest.mark.parametrize(
    "spec", ["a", "a=", "=raise", "a=boom", "a=sleep", "a=raise@0", "a=exit:3"]
)
def test_parse_refuses_nonsense(spec):
    with pytest.raises(FailpointConfigError):
        parse(spec)


def test_raise_fires_only_for_its_name(fp_env):
    fp_env("here=raise")
    failpoint("elsewhere")
    with pytest.raises(FailpointError):
        failpoint("here")
    with pytest.raises(FailpointError):
        failpoint("here")


def test_raise_at_most_n_times(fp_env, tmp_path):
    fp_env("here=raise@2")
    for _ in range(2):
        with pytest.raises(FailpointError):
            failpoint("here")
    failpoint("here")
    failpoint("here")
    assert failpoints.hits("here", str(tmp_path / "fp")) == 2


def test_each_hit_records_who_fired_it(fp_env, tmp_path, monkeypatch):
    """For the chaos run's judge (tools/chaos/faults.py::failpoint_kills)."""
    import os
    import sys

    monkeypatch.setenv("SHOP_HOST_NAME", "b")
    fp_env("here=raise@1")
    with pytest.raises(FailpointError):
        failpoint("here")
    marker = (tmp_path / "fp" / "here.1").read_text()
    assert marker == f"b {os.getpid()} {sys.argv[0]}"


def test_without_a_directory_the_count_is_per_process(monkeypatch):
    monkeypatch.delenv(failpoints.ENV_DIR, raising=False)
    monkeypatch.setenv(failpoints.ENV_SPEC, "per.process=raise@1")
    with pytest.raises(FailpointError):
        failpoint("per.process")
    failpoint("per.process")


def test_sleep_stalls(fp_env):
    fp_env("slow=sleep:200")
    started = time.monotonic()
    failpoint("slow")
    assert time.monotonic() - started >= 0.2


def test_hook_runs_in_process(monkeypatch):
    monkeypatch.delenv(failpoints.ENV_SPEC, raising=False)
    seen = []
    with failpoints.hook("spot", seen.append):
        failpoint("spot")
        failpoint("other")
    failpoint("spot")
    assert seen == ["spot"]


CHILD = """
import sys
from idempotency.failpoints import failpoint
failpoint("boom")
print("survived")
"""


def _child(env_spec: str, fp_dir: Path) -> subprocess.CompletedProcess:
    env = {
        "PATH": "/usr/bin:/bin",
        failpoints.ENV_SPEC: env_spec,
        failpoints.ENV_DIR: str(fp_dir),
    }
    return subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )


def test_exit_kills_the_process_and_at_n_counts_across_processes(tmp_path):
    """`exit@2` kills exactly the first two processes that reach it, whichever they are."""
    results = [_child("boom=exit@2", tmp_path / "fp") for _ in range(4)]
    assert [r.returncode for r in results] == [1, 1, 0, 0]
    assert [r.stdout.strip() for r in results] == ["", "", "survived", "survived"]
    assert "failpoint boom: exit" in results[0].stderr
    assert failpoints.hits("boom", str(tmp_path / "fp")) == 2


def test_at_n_is_exact_under_concurrent_processes(tmp_path):
    """Eight processes started together: exactly three of them fire `exit@3`."""
    env = {"PATH": "/usr/bin:/bin", failpoints.ENV_SPEC: "boom=exit@3"}
    env[failpoints.ENV_DIR] = str(tmp_path / "fp")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(8)
    ]
    codes = sorted(p.wait(timeout=60) for p in procs)
    for p in procs:
        p.stdout.close()
    assert codes == [0, 0, 0, 0, 0, 1, 1, 1]
