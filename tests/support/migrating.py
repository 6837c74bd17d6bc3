"""Move the test database to a migration and back, for tests of data migrations."""

from __future__ import annotations

from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(*targets: tuple[str, str]) -> Apps:
    """Migrate to `targets` (app, migration name); the historical models there."""
    executor = MigrationExecutor(connection)
    executor.migrate(list(targets))
    executor.loader.build_graph()  # what is applied now
    return executor.loader.project_state(list(targets)).apps


def migrate_to_latest() -> None:
    """Every app at its newest migration again (the suite's schema)."""
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
