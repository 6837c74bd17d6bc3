"""The benchmark harness: `make bench` (see docs/performance.md).

`bench.run` records the machine's reference (pgbench, redis-benchmark), starts
gunicorn on a fresh bench database, runs every scenario in `bench/scenarios/`
with the load generator of `bench.loadgen`, and writes `bench/results/`.
"""
