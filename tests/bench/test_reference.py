"""bench/reference.py and the run's reference steps: both reference runs from the same state."""

from __future__ import annotations

from bench import reference
from bench.dbs import PgTarget
from bench.run import Bench, parse_args

TARGET = PgTarget("127.0.0.1", 5432, "postgres", "", "x_pgbench")


def _settle(runnable: list[int], autovacuum: list[int], **kwargs) -> dict:
    samples_r, samples_a = iter(runnable), iter(autovacuum)
    return reference.settle(
        TARGET,
        log=lambda message: None,
        interval=0,
        runnable=lambda: next(samples_r),
        autovacuum=lambda target: next(samples_a),
        **kwargs,
    )


def test_settles_after_three_quiet_samples_in_a_row():
    # Busy, quiet, busy again, then quiet three times: the streak starts over.
    result = _settle([4, 1, 3, 1, 1, 1], [0] * 6, max_wait=60)

    assert result["settled"] is True
    assert result["samples"] == 6


def test_an_autovacuum_worker_keeps_the_machine_unsettled():
    result = _settle([1] * 5 + [1] * 3, [1] * 5 + [0] * 3, max_wait=60)

    assert result["settled"] is True
    assert result["samples"] == 8
    assert result["last"] == {"runnable": 1, "autovacuum_workers": 0}


def test_the_wait_is_bounded_and_says_it_did_not_settle():
    result = _settle([5] * 10, [0] * 10, max_wait=0)

    assert result["settled"] is False
    assert result["samples"] == 1


def test_the_after_reference_drops_the_bench_database_then_starts_like_the_before(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/shop_x")
    bench = Bench(parse_args([]), [])
    calls: list[str] = []
    monkeypatch.setattr(
        "bench.run.drop_database", lambda target: calls.append(f"drop {target.dbname}")
    )
    monkeypatch.setattr(bench.pgbench, "init", lambda: calls.append("pgbench -i"))
    monkeypatch.setattr(reference, "checkpoint", lambda target: calls.append("checkpoint") or 0.1)
    monkeypatch.setattr(
        reference,
        "settle",
        lambda target, *, max_wait, log: (
            calls.append(f"settle {max_wait:g}") or {"settled": True, "waited_s": 2.0, "last": {}}
        ),
    )
    monkeypatch.setattr(bench, "measure_reference", lambda when: calls.append(when) or {})

    before = bench.reference_under_same_conditions("before")
    after = bench.reference_under_same_conditions("after")

    assert calls == [
        "pgbench -i", "checkpoint", "settle 90", "before",
        "drop shop_x_bench", "pgbench -i", "checkpoint", "settle 90", "after",
    ]  # fmt: skip
    assert before["conditions"]["settle"]["waited_s"] == 2.0
    assert after["conditions"]["bench_database"] == "dropped"
    assert bench.created.count(bench.pgbench.target) == 1  # dropped once on the way out
