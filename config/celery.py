"""The Celery app. Configuration lives in Django settings under CELERY_*."""

import os

from celery import Celery
from celery.signals import celeryd_init, task_prerun, worker_ready

from core.patches.celery_publish import BoundedPublishAMQP
from core.patches.worker_clock import DatabaseClockTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")


# Every publish bounded (core/patches/celery_publish.py); every task's worker judges a
# message's ETA by the database clock (core/patches/worker_clock.py); a worker keeps
# its database pool from task to task (core/patches/celery_django.py), where Celery's
# own Django fixup closes it around each one.
app = Celery(
    "shop",
    amqp=BoundedPublishAMQP,
    task_cls=DatabaseClockTask,
    fixups=["core.patches.celery_django:fixup"],
)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@celeryd_init.connect
def _worker_broker_socket_timeout(conf, **kwargs) -> None:
    """Give a worker's Redis broker connections a socket timeout above its BRPOP poll.

    The settings' broker options are for publishers, so that a hung broker
    holds a web request about a second: a 1 s socket timeout and no connect
    retries. A worker's consumer waits in BRPOP one second at a time (at 1 s
    its idle poll would time out and reconnect), and keeps kombu's retries.
    """
    from django.conf import settings

    if settings.BROKER_IS_REDIS:
        options = {k: v for k, v in conf.broker_transport_options.items() if k != "max_retries"}
        conf.broker_transport_options = {
            **options,
            "socket_timeout": settings.BROKER_WORKER_SOCKET_TIMEOUT,
        }


@worker_ready.connect
def _read_clock_offset_in_the_consumer(**kwargs) -> None:
    """The worker's main process decides when a message's ETA is due: it reads the
    database clock's offset too (on a thread of its own: core/patches/worker_clock.py)."""
    from core.patches.worker_clock import start_offset_reader

    start_offset_reader()


@task_prerun.connect
def _note_clock_offset(**kwargs) -> None:
    """A worker process's first task notes its clock's offset from the database's, so
    that its tasks' own retries are timed by the database clock (core.due.retry_eta).

    Not at the process's start: a child that waits there on a hung database is
    killed by its parent as not started. A task waits on the database anyway.
    """
    from core.db import note_clock_offset

    note_clock_offset()
