"""Every runtime patch of a third-party package's internals, in one place.

A module here subclasses or copies what its upstream keeps private (Django's
pool property, psycopg's socket wait, kombu's Redis QoS, gunicorn's gthread
queue, Celery's task sender and request), so an upgrade of that upstream can
silently change what it relies on. Each module's docstring opens with an
`Upstream:` line naming the package, the version it was written against and
what it copies or overrides; tests/patches/test_fences.py pins that version
and the source of each upstream function named, and fails on any difference
until someone has read the new upstream code and moved the pin.

These modules import no domain app: only third-party packages, the deadline
(`core.deadline`) and the database clock (`core.db`). Settings and the
Celery app name them (docs/architecture.md, "Patches of third-party code").
"""
