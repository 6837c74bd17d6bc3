"""kombu's Redis transport with one fix: a lost connection no longer kills the worker.

The failure (kombu 5.7.0, celery 5.7.0; docs/celery.md, "A lost broker"):
when the consumer's Redis connection breaks, celery's
`Consumer.on_connection_error_after_connected` first calls
`connection.collect()` and then `connection.close()`. `collect()` detaches the
transport from its `kombu.Connection` (`transport.client = None`) and, because
closing the channel fails half-way on the dead socket (inside `_brpop_read`,
before the channel is marked closed), leaves the channel open. `close()` then
closes that channel again: it drops its connection pools and, when the worker
holds unacknowledged messages (a task running, or an ETA/countdown message
waiting: `acks_late`), tries to restore them, which builds a new pool from
`transport.client`, now `None`:

    AttributeError: 'NoneType' object has no attribute 'hostname'

An AttributeError is not a connection error, so nothing swallows it: the
consumer dies with "Unrecoverable error" instead of reconnecting.

The fix: restoring unacked messages through a connection that has been
collected is skipped (it could not reach the broker anyway). Nothing is lost:
the messages are still in Redis's unacked hash if Redis survived, and the
visibility-timeout sweep hands them out again; if Redis came back empty, the
database's sweepers publish the work again (the broker is a doorbell).

Selected with `CELERY_BROKER_TRANSPORT = "config.redis_transport:Transport"`;
the URL stays `redis://...`.
"""

from __future__ import annotations

import logging

from kombu.transport import redis

logger = logging.getLogger(__name__)


class QoS(redis.QoS):
    def restore_unacked(self, client=None):
        transport = getattr(self.channel, "connection", None)
        if client is None and getattr(transport, "client", None) is None:
            delivered = self._delivered
            assert delivered is not None  # kombu's QoS.__init__ sets it; None is the class default
            logger.warning(
                "broker connection gone: %d unacknowledged message(s) left to the"
                " visibility timeout",
                len(delivered),
            )
            delivered.clear()
            return None
        return super().restore_unacked(client)


class Channel(redis.Channel):
    QoS = QoS


class Transport(redis.Transport):
    Channel = Channel
