"""The Celery app. Configuration lives in Django settings under CELERY_*."""

import contextlib
import os
from collections.abc import Iterator

from celery import Celery
from celery.app.amqp import AMQP
from celery.signals import celeryd_init, task_prerun, worker_ready

from core.worker_clock import DatabaseClockTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")


class BoundedPublishAMQP(AMQP):
    """Every publish waits at most BROKER_PUBLISH_TIMEOUT for the broker.

    Without a bound a RabbitMQ under a memory alarm (it stops reading from
    publishers, and confirms never come) blocks the publishing request for as
    long as the alarm lasts. With it the publish raises; every publish of this
    shop rings for a due row or an outbox row, which the sweeper or the relay
    publishes again, so the work is late, never lost.
    """

    def _create_task_sender(self):
        send = super()._create_task_sender()  # type: ignore[misc]  # Celery's own hook, untyped

        def send_task_message(producer, name, message, **kwargs):
            from django.conf import settings

            from core.deadline import bounded

            # In a web request, no longer than what is left of its deadline.
            bound = bounded(settings.BROKER_PUBLISH_TIMEOUT)
            kwargs["timeout"] = kwargs.get("timeout") or bound
            kwargs["confirm_timeout"] = kwargs.get("confirm_timeout") or bound
            try:
                with _amqp_socket_bounded(producer, bound):
                    return send(producer, name, message, **kwargs)
            except Exception:
                # A timed-out confirm may still arrive later on this channel and
                # be taken for the next message's: never reuse that connection.
                try:
                    producer.connection.collect()
                except Exception:  # noqa: BLE001, S110 - it is being thrown away
                    pass
                raise

        return send_task_message


@contextlib.contextmanager
def _amqp_socket_bounded(producer, seconds: float) -> Iterator[None]:
    """On RabbitMQ, every read and write of the publish waits at most `seconds`.

    The confirm and the frame write have their own timeouts, but the publish
    first declares its queue on a connection that has not published to it
    yet (kombu's `maybe_declare`), and that RPC waits for the broker's answer
    with none: on a partitioned link the ring of a web request would wait
    until the heal, past the request's deadline (docs/failure-model.md, "What
    broke, and what fixed it"). With the socket's own timeout every wait on it
    raises instead; the publish fails, the connection is thrown away and the
    row is rung again by its sweeper. Connecting is bounded by the broker
    connection timeout (CELERY_BROKER_CONNECTION_TIMEOUT). Redis: its
    `socket_timeout` transport option bounds its socket already.
    """
    if producer.connection.transport.driver_type != "amqp":
        yield
        return
    producer.channel  # noqa: B018 - connects now, so that the socket below exists
    with producer.connection.connection.transport.having_timeout(seconds):
        yield


# Every task's worker judges a message's ETA by the database clock (core/worker_clock.py).
app = Celery("shop", amqp=BoundedPublishAMQP, task_cls=DatabaseClockTask)
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
    database clock's offset too (on a thread of its own: core/worker_clock.py)."""
    from core.worker_clock import start_offset_reader

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
