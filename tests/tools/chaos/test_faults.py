"""The chaos run's dependency faults: their schedule, the /healthz judgement, the actions."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections import Counter

import psycopg
import pytest

from runner.processes import die_with_parent
from tools.chaos import faults as faults_module
from tools.chaos.faults import (
    DOWN_WITHIN,
    GAP,
    JUDGED,
    REQUIRED,
    Fault,
    Faults,
    failpoint_kills,
    judge,
    timing_lines,
    timings,
)


def _faults(*, hosts=("a", "b"), rabbitmq=False, seed=1, **kwargs) -> Faults:
    return Faults(
        proxies={},
        hosts={name: f"http://{name}" for name in hosts},
        timeline=lambda record: None,
        rng=random.Random(seed),
        redis_pid=lambda: None,
        rabbitmq=rabbitmq,
        restart_host=kwargs.pop("restart_host", lambda name: "restarted"),
        gap=kwargs.pop("gap", 0.0),
        **kwargs,
    )


@pytest.mark.parametrize("rabbitmq", [False, True])
@pytest.mark.parametrize("hosts", [("a",), ("a", "b")])
@pytest.mark.parametrize("seed", range(5))
def test_the_short_form_makes_a_crash_a_partition_and_a_hung_broker_one_at_a_time(
    rabbitmq, hosts, seed
):
    plan = _faults(hosts=hosts, rabbitmq=rabbitmq, seed=seed).plan(180.0)
    kinds = Counter(fault.kind for _, fault in plan)
    for group in REQUIRED:
        assert any(kinds[kind] for kind in group), (group, kinds)
    # Never two at once, each followed by a quiet gap, all within the run.
    for (at, fault), (next_at, _) in zip(plan, plan[1:], strict=False):
        assert next_at >= at + fault.seconds + GAP - 1e-6
    at, last = plan[-1]
    assert at + last.seconds + GAP <= 180.0


@pytest.mark.parametrize("rabbitmq", [False, True])
def test_the_long_form_makes_every_kind_several_times(rabbitmq):
    faults = _faults(rabbitmq=rabbitmq)
    plan = faults.plan(1800.0)
    kinds = Counter(fault.kind for _, fault in plan)
    expected = {p.kind for p in _faults(rabbitmq=rabbitmq).kinds(long=True)}
    assert set(kinds) == expected and "supervisor_kill" in expected
    assert min(kinds.values()) >= 5, kinds
    # The same proxy (a host's db or broker link) is never faulted twice at once.
    busy: dict[tuple[str, str], float] = {}
    for at, fault in plan:
        link = (fault.host, fault.kind.split("_")[0])
        assert at >= busy.get(link, 0.0)
        busy[link] = at + fault.seconds
        assert 5 <= fault.seconds <= 30 or fault.kind not in ("db_partition", "broker_partition")


def test_schedule_returns_one_action_per_planned_fault():
    faults = _faults()
    events = faults.schedule(180.0)
    assert len(events) == len(faults.planned) >= 6
    assert [at for at, _ in events] == sorted(at for at, _ in events)


def _samples(host: str, start: float, statuses: list[int | None], *, every=0.5, took=0.1):
    return [
        {"host": host, "t": start + i * every, "status": s, "took": took}
        for i, s in enumerate(statuses)
    ]


def test_judge_counts_a_503_in_time_and_a_200_after_the_heal():
    fault = Fault("pg_hang", "*", start=100.0, end=106.0)
    samples = _samples("a", 100.2, [503] * 12 + [200]) + _samples("b", 100.1, [503] * 13 + [200])
    assert judge([fault], samples) == ([], [])
    row = timings([fault], samples)[0]
    assert row["to_503"] == pytest.approx(0.2, abs=0.01)
    assert row["to_200"] == pytest.approx(0.7, abs=0.01)  # host b, the slower one


def test_judge_reports_a_late_503_a_slow_answer_and_a_missing_200():
    fault = Fault("db_partition", "a", start=100.0, end=110.0)
    # Host a's first 503 came 2.5 s after the start; host b is not touched by this fault.
    late = _samples("a", 102.5, [503] * 15) + _samples("b", 100.0, [503, 200])
    late_down, late_up = judge([fault], late)
    assert len(late_down) == 1 and "no 503 in time" in late_down[0]
    assert len(late_up) == 1 and "on a healed" in late_up[0]
    # A 503 that started in time but took longer than 2 s (queued behind busy workers).
    slow = _samples("a", 100.1, [503], took=3.0) + _samples("a", 111.0, [200])
    assert judge([fault], slow)[0] != [] and judge([fault], slow)[1] == []


def test_a_503_that_arrived_within_2_s_counts_though_its_sample_was_sent_before_the_fault():
    """A long Redis run's case: host a healthy, a db_partition at 100.0;
    the sample sent at 99.81 was answered 503 at 101.58, the next (sent at 102.08) got no
    answer (the run killed a's web worker at 102.09), the one after was 503 at 103.6."""
    fault = Fault("db_partition", "a", start=100.0, end=115.0)
    samples = (
        _samples("a", 98.3, [200, 200, 200])
        + [{"host": "a", "t": 99.81, "status": 503, "took": 1.77}]
        + [{"host": "a", "t": 102.08, "status": None, "took": 5.0}]
        + _samples("a", 103.5, [503] * 20, took=0.1)
        + _samples("a", 116.0, [200])
    )
    assert judge([fault], samples, server_kills=[("a", 102.09)]) == ([], [])
    # Wrong twin: samples counted only by when they were sent (the judge of that run).
    sent_in_time = [
        s for s in samples
        if s["status"] == 503 and fault.start <= s["t"] <= fault.start + DOWN_WITHIN
        and s["took"] <= DOWN_WITHIN
    ]  # fmt: skip
    assert sent_in_time == []
    # A 503 that arrived in time but followed no 200 says nothing of this fault.
    unhealthy = [{**s, "status": 503} if s["t"] < 99.5 else s for s in samples]
    assert judge([fault], unhealthy, server_kills=[("a", 102.09)])[0] != []
    # One that arrived 2.5 s in is late.
    late = [{**s, "took": 2.69} if s["t"] == 99.81 else s for s in samples]
    assert judge([fault], late, server_kills=[("a", 102.09)])[0] != []


def test_faults_healthz_need_not_see_are_not_judged():
    made = [Fault(kind, "*", 100.0, 101.0) for kind in ("provider_kill", "memory_alarm")]
    made.append(Fault("supervisor_kill", "a", 100.0, 120.0))
    assert not JUDGED & {f.kind for f in made}
    assert judge(made, []) == ([], [])
    lines = timing_lines(made, [])
    assert lines == [
        "memory_alarm ×1: 1.0-1.0 s",
        "provider_kill ×1: 1.0-1.0 s",
        "supervisor_kill ×1: 20.0-20.0 s",
    ]


def _wait_made(faults: Faults, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(faults.made) + len(faults.problems) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_each_action_is_made_and_recorded_with_its_length(monkeypatch):
    calls: list[str] = []

    class Postgres:
        def crash(self) -> float:
            calls.append("crash")
            return 1.5

        def pause(self) -> list[int]:
            calls.append("pause")
            return [1, 2]

        def resume(self, stopped: list[int]) -> None:
            calls.append(f"resume {stopped}")

    class Simulator:
        def kill_and_restart(self) -> None:
            calls.append("provider")

    records: list[dict] = []

    def restart_host(name: str) -> str:
        calls.append(f"host {name}")
        return "0 orphans"

    faults = _faults(postgres=Postgres(), simulator=Simulator(), restart_host=restart_host)
    faults.timeline = records.append
    for kind, host in (("pg_crash", "*"), ("pg_hang", "*"), ("provider_kill", "*"),
                       ("supervisor_kill", "b")):  # fmt: skip
        faults._action(faults_module.Planned(kind, host, 0.05))()
    _wait_made(faults, 4)
    assert sorted(calls) == sorted(["crash", "pause", "resume [1, 2]", "provider", "host b"])
    assert Counter(r["kind"] for r in records) == Counter(
        {"pg_crash": 1, "pg_hang": 1, "provider_kill": 1, "supervisor_kill": 1}
    )
    crash = next(r for r in records if r["kind"] == "pg_crash")
    assert "1.5 s" in crash["note"] and crash["end"] >= crash["t"]
    assert faults.problems == []


def test_a_fault_that_cannot_be_made_is_a_problem_not_a_silent_pass():
    class Broken:
        def crash(self) -> float:
            raise RuntimeError("postgres did not come back")

    faults = _faults(postgres=Broken())
    faults.pg_crash()
    _wait_made(faults, 2)
    assert faults.problems == ["a fault failed: RuntimeError: postgres did not come back"]
    assert [f.kind for f in faults.made] == ["pg_crash"]  # recorded: it was made (and broke)


@pytest.mark.timeout(120)
def test_the_runs_own_postgres_keeps_commits_across_a_crash_and_hangs(tmp_path):
    """SIGKILL of every server process, crash recovery, no committed row lost; SIGSTOP of
    every server process makes a new connection wait, SIGCONT ends the wait."""
    from tools.chaos.postgres import ChaosPostgres

    server = ChaosPostgres(tmp_path)
    server.create()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE acked (n int)")
            for n in range(50):
                conn.execute("INSERT INTO acked VALUES (%s)", [n])
        took = server.crash()
        assert took < 60 and server.crashes == 1
        log = (tmp_path / "postgres.log").read_text()
        assert "automatic recovery in progress" in log
        with psycopg.connect(server.url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM acked").fetchone() == (50,)

        stopped = server.pause()
        assert len(stopped) >= 2  # the postmaster and its background processes
        resumed = threading.Timer(2.0, server.resume, args=(stopped,))
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url, connect_timeout=1).close()
        resumed.start()
        with psycopg.connect(server.url, connect_timeout=10, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM acked").fetchone() == (50,)
        assert time.monotonic() - started >= 1.5
    finally:
        server.drop()


def test_a_process_a_fault_starts_again_outlives_the_faults_thread():
    """The parent-death signal fires when the forking THREAD ends: a restart made from
    the fault's own thread was SIGTERMed at once (PostgreSQL, 0.6 s after its recovery)."""
    started: list[subprocess.Popen] = []

    class Simulator:
        def kill_and_restart(self) -> None:
            started.append(
                subprocess.Popen(["sleep", "30"], preexec_fn=die_with_parent(signal.SIGTERM))
            )

    faults = _faults(simulator=Simulator())
    try:
        faults.provider_kill()
        _wait_made(faults, 1)
        assert [f.kind for f in faults.made] == ["provider_kill"] and faults.problems == []
        time.sleep(0.5)  # the fault's thread has ended by now
        assert started[0].poll() is None, "the restarted process died with the fault's thread"
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def test_faults_are_made_one_at_a_time_and_none_starts_after_the_end():
    """A fault that outlasts its slot (a supervisor restart under load) delays the next
    one instead of overlapping it; finish() lets the current one heal and skips the rest."""
    spans: list[tuple[str, float, float]] = []

    class Postgres:
        def pause(self) -> list[int]:
            spans.append(("pause", time.monotonic(), 0.0))
            return []

        def resume(self, stopped: list[int]) -> None:
            spans.append(("resume", time.monotonic(), 0.0))

    faults = _faults(postgres=Postgres(), gap=0.2)
    faults.pg_hang(0.3)
    time.sleep(0.05)
    faults.pg_hang(0.3)  # due while the first is still being made
    time.sleep(0.05)
    faults.pg_hang(0.3)
    time.sleep(0.5)
    faults.finish(timeout=5)
    names = [name for name, _, _ in spans]
    assert names == ["pause", "resume", "pause", "resume"]  # the third was never made
    assert spans[2][1] - spans[1][1] >= 0.2  # the second waited for the first's heal + gap
    assert faults.skipped == ["pg_hang"] and len(faults.made) == 2
    assert faults.missing() == []  # nothing was planned, so nothing required is missing
    faults.planned = [faults_module.Planned("pg_crash", "*", 5.0)]
    assert faults.missing() == ["no pg_crash made"]


def test_every_fault_kind_is_a_band_in_the_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need the tooling lock: make tools")
    import json

    from tools.chaos import plot

    t0 = time.time()
    (tmp_path / "answers.jsonl").write_text(json.dumps({"t": t0 + 1, "status": 201}) + "\n")
    records = [{"t": t0, "type": "workload_start"}] + [
        {"t": t0 + 2 * i, "type": "fault", "kind": kind, "host": "*", "end": t0 + 2 * i + 1}
        for i, kind in enumerate(sorted(plot.FAULT_COLOURS))
    ]
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = plot.plot(tmp_path, title="faults")
    assert out.stat().st_size > 1000
    assert set(plot.FAULT_COLOURS) >= {p.kind for p in _faults(rabbitmq=True).kinds(long=True)}


def test_a_request_is_judged_hung_only_past_the_deadline_and_only_in_a_dependency_fault():
    from tools.chaos.faults import Fault, hung_requests

    made = [
        Fault("pg_hang", "*", start=100.0, end=110.0),
        Fault("db_partition", "a", start=150.0, end=170.0),
        Fault("supervisor_kill", "a", start=200.0, end=230.0),
    ]
    answers = [
        {"t": 99.0, "took": 5.0, "host": "a", "status": 201},  # overlapped, in time
        {"t": 101.0, "took": 30.0, "host": "b", "status": None},  # overlapped, hung
        {"t": 152.0, "took": 21.5, "host": "a", "status": 503},  # deadline + 1.5 s: in time
        {"t": 155.0, "took": 25.0, "host": "b", "status": 200},  # the partition was a's
        {"t": 205.0, "took": 30.0, "host": "a", "status": None},  # the host itself was gone
        {"t": 300.0, "took": 30.0, "host": "a", "status": None},  # no fault at all
        {"t": 120.0, "host": "a", "status": 201},  # a line from before "took" was logged
    ]
    judged, late, outside = hung_requests(made, answers, limit=22.0)
    assert judged == 3
    assert len(late) == 1 and "took 30.0 s" in late[0] and "pg_hang" in late[0]
    assert outside == []


def test_a_request_is_judged_by_how_long_the_server_had_it():
    """The server's Server-Timing counts as its deadline counts; what the client saw
    beyond it was spent before the server took the request: reported, not judged."""
    from tools.chaos.faults import Fault, hung_requests

    made = [Fault("db_partition", "a", start=103.4, end=120.8)]
    answers = [
        # A 22.6 s checkout of which the server had 20.1 s: within its deadline + 2 s.
        {"t": 100.0, "took": 22.6, "server_took": 20.1, "host": "a", "status": 503},
        {"t": 104.0, "took": 24.0, "server_took": 23.9, "host": "a", "status": 503},
        {"t": 105.0, "took": 30.0, "server_took": None, "host": "a", "status": None},
    ]
    judged, late, outside = hung_requests(made, answers, limit=22.0)
    assert judged == 3
    assert [m.split(" (")[0] for m in late] == ["None None on a took 24.0 s",
                                                "None None on a took 30.0 s"]  # fmt: skip
    assert len(outside) == 1 and "20.1 s in the server" in outside[0]


def test_a_heal_is_counted_from_when_a_killed_web_server_answers_again():
    """The run's killer SIGKILLed host a's gunicorn master just before the heal and again
    7 s after it: no server answered for 16 s, then a later fault on the host held
    /healthz at 503. Neither is a late /healthz (the long run on Redis counted one)."""
    crash = Fault("pg_crash", "*", start=97.7, end=100.0)
    partition = Fault("db_partition", "a", start=114.9, end=135.8)
    samples = (
        _samples("a", 100.3, [None] * 32, took=0.002)  # no server listening
        + _samples("a", 116.2, [503] * 38)  # answering again, inside the partition
        + _samples("a", 136.0, [200])
        + _samples("b", 100.3, [200])
    )
    kills = [("a", 99.9), ("a", 107.0)]
    assert judge([crash, partition], samples, server_kills=kills)[1] == []
    # Wrong twin: the heal judged from the fault's end whatever the run killed.
    assert judge([crash, partition], samples)[1] == [
        "pg_crash on a healed at 100.0: no 200 in time"
    ]
    # The server answering again but /healthz still 503 10 s later, no later fault: late.
    assert judge([crash], samples, server_kills=kills)[1] != []
    # A kill on the other host changes nothing for this one.
    assert judge([crash, partition], samples, server_kills=[("b", 99.9)])[1] != []


def test_a_fault_that_began_while_a_killed_web_worker_booted_again_is_judged_from_its_answer():
    """The long run on RabbitMQ: host b's gunicorn worker killed 3 s before a broker
    partition and again 1.7 s into it; the sample sent 1 s before the fault was answered
    503 at 2.15 s (it waited for a worker), the next one started at 2.65 s."""
    fault = Fault("broker_partition", "b", start=100.0, end=113.9)
    samples = (
        _samples("b", 98.25, [200])
        + [{"host": "b", "t": 99.03, "status": 503, "took": 3.12}]
        + _samples("b", 102.65, [503] * 20, every=0.8, took=1.2)
        + _samples("b", 114.5, [200])
    )
    kills = [("b", 97.0), ("b", 101.7)]
    assert judge([fault], samples, server_kills=kills) == ([], [])
    # Wrong twin: the window counted from the fault's start whatever the run killed.
    assert judge([fault], samples)[0] == ["broker_partition on b at 100.0: no 503 in time"]
    # No kill near the fault: a 503 this late is late.
    assert judge([fault], samples, server_kills=[("b", 60.0)])[0] != []
    # After the kill the host answered 200 first and 503 only 3 s later: late.
    slow = (
        [{"host": "b", "t": 101.8, "status": 200, "took": 0.1}]
        + _samples("b", 104.9, [503] * 12, every=0.8)
        + _samples("b", 114.5, [200])
    )
    assert judge([fault], slow, server_kills=[("b", 101.7)])[0] != []


def test_a_fault_a_host_had_no_server_for_is_not_late():
    """A long RabbitMQ run's case: both of host b's gunicorn workers
    exited by failpoints 0.75 s and 1.15 s into a broker partition, the killer took its
    master at 4.95 s, and the host's first answer came after the heal (a 200, rightly)."""
    fault = Fault("broker_partition", "b", start=100.0, end=115.56)
    samples = (
        _samples("b", 96.93, [200], took=2.64)
        + [{"host": "b", "t": 100.09, "status": None, "took": 0.78}]  # worker gone
        + [{"host": "b", "t": 101.37, "status": None, "took": 3.62}]  # master gone
        + _samples("b", 105.49, [None] * 5, took=0.005)  # nothing listening
        + [{"host": "b", "t": 113.55, "status": 200, "took": 3.28}]  # answered at 116.8
        + _samples("b", 117.33, [200])
    )
    exits = [("b", 100.75), ("b", 101.15)]  # failpoint exits in its gunicorn workers
    assert judge([fault], samples, server_kills=[*exits, ("b", 104.95)]) == ([], [])
    # Wrong twin: the failpoint exits not counted as kills of the host's server.
    assert judge([fault], samples, server_kills=[("b", 104.95)])[0] == [
        "broker_partition on b at 100.0: no 503 in time"
    ]
    # A host that answered during the fault after the kill, but 200: late.
    answered = [*samples, {"host": "b", "t": 110.0, "status": 200, "took": 0.5}]
    assert judge([fault], answered, server_kills=exits)[0] != []


def test_failpoint_exits_in_a_web_worker_are_kills_of_its_hosts_server(tmp_path):
    (tmp_path / "returns.receive.before_decide.1").write_text(
        "b 28661 /venv/lib/python3.11/site-packages/gunicorn/__main__.py"
    )
    (tmp_path / "compensation.refund.after_effect.1").write_text(
        "a 30001 /venv/lib/python3.11/site-packages/celery/__main__.py"
    )
    (tmp_path / "checkout.capture.after.1").write_text("")  # being written
    kills = failpoint_kills(tmp_path)
    assert [host for host, _ in kills] == ["b"]
    assert abs(kills[0][1] - (tmp_path / "returns.receive.before_decide.1").stat().st_mtime) < 1e-6
    assert failpoint_kills(tmp_path / "missing") == []


def test_a_fault_that_began_while_a_killed_master_was_still_starting_is_judged_from_its_answer():
    """A long RabbitMQ run's case: host b's gunicorn master SIGKILLed
    6.1 s before a broker partition; no answer until its first, a 503 at 3.3 s."""
    fault = Fault("broker_partition", "b", start=100.0, end=126.2)
    samples = (
        _samples("b", 90.0, [200])
        + _samples("b", 95.47, [None, None], took=0.02)  # nothing listening
        + [{"host": "b", "t": 96.52, "status": None, "took": 5.06}]  # booting
        + _samples("b", 102.09, [503] * 14, every=1.7, took=1.2)
        + _samples("b", 126.98, [200])
    )
    assert judge([fault], samples, server_kills=[("b", 93.9)]) == ([], [])
    # Wrong twin: the old window (kills from 5 s before the fault) left this kill out.
    assert judge([fault], samples, server_kills=[])[0] == [
        "broker_partition on b at 100.0: no 503 in time"
    ]
    # The host answered again before the fault began: an earlier kill excuses nothing.
    back = [*samples, {"host": "b", "t": 97.0, "status": 200, "took": 0.3}]
    assert judge([fault], back, server_kills=[("b", 93.9)])[0] != []
