"""Celery's task sender, each publish bounded by `BROKER_PUBLISH_TIMEOUT` and the deadline.

Upstream: celery 5.7.0 and amqp 5.4.2. Wraps the function
`celery.app.amqp.AMQP._create_task_sender` returns (a private hook: its
arguments `producer, name, message, **kwargs` and its `timeout` and
`confirm_timeout` keywords), and on RabbitMQ sets the timeout of the socket
under `producer.connection.connection.transport` for the whole publish
(`amqp.transport._AbstractTransport.having_timeout`).

The Celery app's `amqp` class (config/celery.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from celery.app.amqp import AMQP
from django.conf import settings

from core.deadline import bounded


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
