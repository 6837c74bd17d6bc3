"""Settings come from the environment; checked in a fresh interpreter each time."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRINT_SETTINGS = """
import json, django
from django.conf import settings
django.setup()
db = settings.DATABASES['default']
print(json.dumps({
    'db': [db['ENGINE'], db['HOST'], db['PORT'], db['NAME'], db['USER']],
    'pool': {k: (f"{v.__module__}.{v.__qualname__}" if isinstance(v, type) else v)
             for k, v in (db.get('OPTIONS', {}).get('pool') or {}).items()} or None,
    'broker': settings.CELERY_BROKER_URL,
    'cache': settings.CACHES['default']['LOCATION'],
    'currency': settings.SHOP_CURRENCY,
    'debug': settings.DEBUG,
    'secret': settings.SECRET_KEY,
    'transport': settings.CELERY_BROKER_TRANSPORT_OPTIONS,
    'acks_late': settings.CELERY_TASK_ACKS_LATE,
    'serializer': [settings.CELERY_TASK_SERIALIZER, settings.CELERY_ACCEPT_CONTENT],
}))
"""


def _settings(**env) -> dict:
    full = {
        k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_", "SHOP_"))
    }
    # The checkout's .env (if any) must not leak into what is checked here.
    full.update(SHOP_ENV_FILE=os.devnull)
    full.update(env, DJANGO_SETTINGS_MODULE="config.settings.base")
    out = subprocess.run(
        [sys.executable, "-c", PRINT_SETTINGS],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_urls_and_values_come_from_environment():
    s = _settings(
        DATABASE_URL="postgres://shopuser:pw@db.internal:6543/shopdb",
        REDIS_URL="redis://cache.internal:6380/3",
        SHOP_CURRENCY="USD",
        DEBUG="true",
        SECRET_KEY="s3cret",
        DB_POOL="false",
    )
    assert s["db"] == ["core.patches.postgresql", "db.internal", 6543, "shopdb", "shopuser"]
    assert s["pool"] is None
    assert s["broker"] == "redis://cache.internal:6380/3"
    assert s["cache"] == "redis://cache.internal:6380/3"
    assert s["currency"] == "USD"
    assert s["debug"] is True
    assert s["secret"] == "s3cret"


def test_defaults_are_postgres_pool_eur_and_deliberate_celery():
    s = _settings(DATABASE_URL="postgres://u@h:5432/d", REDIS_URL="redis://h:6379/0")
    assert s["db"][0] == "core.patches.postgresql"
    assert s["pool"]["max_size"] >= 1
    # Every wait on the database bounded by a web request's deadline (core/deadline.py).
    assert s["pool"]["connection_class"] == "core.patches.psycopg_connection.DeadlineConnection"
    assert s["currency"] == "EUR"
    assert s["debug"] is False
    assert s["acks_late"] is True
    assert s["serializer"] == ["json", ["json"]]
    transport = s["transport"]
    # A killed worker's task must come back in well under a minute, and the
    # restore sweep must run (kombu >= 5.7 honours these two keys).
    assert transport["visibility_timeout"] <= 120
    assert transport["unacked_restore_interval"] * transport["unacked_restore_throttle"] <= 10


def test_sqlite_url_is_still_postgres_engine_refused():
    """The shop never runs on SQLite: the engine is forced to PostgreSQL."""
    s = _settings(DATABASE_URL="postgres://u@h/d")
    assert s["db"][0] == "core.patches.postgresql"


def test_a_socket_url_puts_the_folder_in_host_where_dbshell_passes_it_to_psql():
    s = _settings(DATABASE_URL="postgres://postgres@/shop?host=/tmp/shop-abc/pg")
    assert s["db"][1:] == ["/tmp/shop-abc/pg", "", "shop", "postgres"]
    from django.db.backends.postgresql.client import DatabaseClient

    settings_dict = {"HOST": "/tmp/shop-abc/pg", "NAME": "shop", "USER": "postgres", "OPTIONS": {}}
    args, _ = DatabaseClient.settings_to_cmd_args_env(settings_dict, [])
    assert args == ["psql", "-U", "postgres", "-h", "/tmp/shop-abc/pg", "shop"]


def test_env_file_fills_in_what_the_environment_does_not_set(tmp_path):
    env_file = tmp_path / "shop.env"
    env_file.write_text(
        "# a comment\n"
        "DATABASE_URL=postgres://fromfile@dbfile:5433/filedb\n"
        "export SHOP_CURRENCY='USD'\n"
        'SECRET_KEY="from-file"\n'
    )
    s = _settings(SHOP_ENV_FILE=str(env_file), SECRET_KEY="from-environment")
    assert s["db"][1:] == ["dbfile", 5433, "filedb", "fromfile"]
    assert s["currency"] == "USD"
    assert s["secret"] == "from-environment"  # the environment wins
