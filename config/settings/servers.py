"""The servers every process talks to: PostgreSQL (DATABASES) and Redis (CACHES).

Imported by base.py; the broker's settings, which default to this Redis, are
in celery.py.
"""

import sys
from pathlib import Path

from core.patches.psycopg_connection import DeadlineConnection

from .environment import env

# --- PostgreSQL -------------------------------------------------------------
# Never SQLite: every guarantee of this shop rests on PostgreSQL's constraints
# and row locks. Django's psycopg 3 pool keeps connections warm per process.
DATABASE_URL = env.str("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/postgres")
DATABASES = {"default": env.db_url_config(DATABASE_URL)}
# Django's PostgreSQL backend, its pool's wait bounded by a web request's
# deadline (core/patches/postgresql).
DATABASES["default"]["ENGINE"] = "core.patches.postgresql"
# A Unix-socket URL (`?host=/folder`, the embedded server) leaves the folder in
# OPTIONS, where `dbshell` does not look (psql gets HOST only): move it to HOST,
# which psycopg takes as a socket folder as well.
if not DATABASES["default"].get("HOST") and DATABASES["default"].get("OPTIONS", {}).get("host"):
    DATABASES["default"]["HOST"] = DATABASES["default"]["OPTIONS"].pop("host")
# Check a pooled connection before handing it out: after the database restarts
# (the run command restarts a dead embedded server) the pool would otherwise
# give each request a dead connection once.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DB_POOL = env.bool("DB_POOL", default=True)
if DB_POOL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env.int("DB_POOL_MIN", default=1),
        "max_size": env.int("DB_POOL_MAX", default=8),
        "timeout": env.float("DB_POOL_TIMEOUT", default=10.0),
        # Each wait on the database bounded by the web request's deadline (core/deadline.py).
        "connection_class": DeadlineConnection,
    }
DATABASES["default"]["CONN_MAX_AGE"] = 0
# Parameters bound by the server, and a statement a connection has run
# DB_PREPARE_THRESHOLD times prepared there: PostgreSQL then parses and plans
# it once per connection instead of once per execution, and psycopg sends the
# values instead of quoting them into the text (docs/performance.md,
# "Prepared statements"). Django leaves both off; DB_PREPARED=false turns them
# off again (a pooler in transaction mode in front of PostgreSQL needs that).
if env.bool("DB_PREPARED", default=True):
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = env.int(
        "DB_PREPARE_THRESHOLD", default=5
    )
# Bounded waits on every connection (docs/deployment.md, "Timeouts and
# durability"): a database that stops answering fails a request in seconds
# instead of holding it. connect_timeout bounds the connect (libpq's floor is
# 2 s); statement_timeout and lock_timeout are server-side bounds on one
# statement and on one lock wait (the claim's own shorter SET LOCAL wins);
# tcp_user_timeout and keepalives end a connection whose peer vanished from
# the network (a partition), which a server-side timeout cannot see.
# Migrations and long maintenance commands get no statement or lock bound
# (a migration on a big table may rewrite it for minutes): see
# DB_UNBOUNDED_COMMANDS below.
DB_CONNECT_TIMEOUT = env.int("DB_CONNECT_TIMEOUT", default=3)
DB_STATEMENT_TIMEOUT = env.float("DB_STATEMENT_TIMEOUT", default=30.0)
DB_LOCK_TIMEOUT = env.float("DB_LOCK_TIMEOUT", default=15.0)
# A transaction left open by a client that is gone (a partitioned host, a hung
# process) holds its row locks until the server ends it: the server does, after
# this long idle inside a transaction; without it such a session holds its rows
# (loyalty rows every later delivery waits on) with no bound in time
# (docs/failure-model.md, "What broke, and what fixed it").
DB_IDLE_IN_TRANSACTION_TIMEOUT = env.float("DB_IDLE_IN_TRANSACTION_TIMEOUT", default=60.0)
# A web request's deadline (core/deadline.py): no wait on the database outlives
# it, whatever the database or the link does. Above every bound a request adds
# up on its way (a pooled connection 10 s, the provider 5 s); under the 30 s a
# load balancer or a client commonly waits. 0: none.
WEB_REQUEST_TIMEOUT = env.float("WEB_REQUEST_TIMEOUT", default=20.0)
# How often the server checks, while a statement runs or waits for a lock, that
# its client is still there (PostgreSQL >= 14, Linux): a connection a request's
# deadline closed (core/deadline.py) or a killed process's stops its statement
# and lets go of its locks within this, instead of running it to the end or
# waiting out lock_timeout first.
DB_CLIENT_CHECK_INTERVAL = env.float("DB_CLIENT_CHECK_INTERVAL", default=1.0)
DB_UNBOUNDED_COMMANDS = frozenset(
    {"migrate", "release", "dbshell", "sqlflush", "flush", "loaddata"}
)
if sys.argv[1:2] and sys.argv[1] in DB_UNBOUNDED_COMMANDS and Path(sys.argv[0]).name == "manage.py":
    DB_STATEMENT_TIMEOUT = DB_LOCK_TIMEOUT = DB_IDLE_IN_TRANSACTION_TIMEOUT = 0.0
_db_options = DATABASES["default"].setdefault("OPTIONS", {})
_db_options.setdefault("connect_timeout", DB_CONNECT_TIMEOUT)
_db_options["options"] = (
    f"{_db_options.get('options', '')}"
    f" -c statement_timeout={int(DB_STATEMENT_TIMEOUT * 1000)}"
    f" -c lock_timeout={int(DB_LOCK_TIMEOUT * 1000)}"
    f" -c idle_in_transaction_session_timeout={int(DB_IDLE_IN_TRANSACTION_TIMEOUT * 1000)}"
    f" -c client_connection_check_interval={int(DB_CLIENT_CHECK_INTERVAL * 1000)}"
).strip()
_db_options.setdefault("keepalives", 1)
_db_options.setdefault("keepalives_idle", 10)
_db_options.setdefault("keepalives_interval", 5)
_db_options.setdefault("keepalives_count", 3)
_db_options.setdefault("tcp_user_timeout", env.int("DB_TCP_USER_TIMEOUT_MS", default=20000))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: cache and throttles (and the broker unless CELERY_BROKER_URL) ------
REDIS_URL = env.str("REDIS_URL", default="redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        # Throttle counters must be shared by every web process: Redis, not
        # per-process memory.
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": env.str("CACHE_KEY_PREFIX", default="shop"),
        "TIMEOUT": 300,
        # A Redis that hangs (SIGSTOP, partition) fails a throttle look-up in
        # a second instead of holding the request (and its web thread).
        "OPTIONS": {
            "socket_connect_timeout": env.float("REDIS_CONNECT_TIMEOUT", default=1.0),
            "socket_timeout": env.float("REDIS_SOCKET_TIMEOUT", default=1.0),
        },
    }
}
