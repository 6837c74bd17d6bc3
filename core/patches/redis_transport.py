"""kombu's Redis transport with two fixes: a lost connection no longer kills the worker,
and the visibility timeout is judged by the Redis server's clock, not each host's.

Upstream: kombu 5.7.0. Copies `kombu.transport.redis.QoS.append` and
`QoS.restore_visible` (each with one change: the Redis server's clock for the
host's), and overrides `QoS.restore_unacked`, reading the private
`_delivered` and `_vrestore_count`.

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

The visibility timeout: kombu scores each delivered, unacknowledged message
with the consumer host's `time()` and hands it out again once some worker's
`time()` is past that score + the timeout. Two hosts whose clocks differ
disagree: a host ahead scores its messages in the future, and when its
worker is killed holding them, the other hosts' workers restore them that
much later (docs/failure-model.md, "What broke, and what fixed it"). Here
both the score and the restore's bound are the Redis server's clock
(`TIME`), through an offset each channel reads once a minute: a decision
every host shares, judged by one clock.

Selected with `CELERY_BROKER_TRANSPORT = "core.patches.redis_transport:Transport"`;
the URL stays `redis://...`.
"""

from __future__ import annotations

import logging
import time

from kombu.transport import redis, virtual
from kombu.utils.json import dumps

# How often a channel reads the Redis server's clock again (its offset from this host's).
BROKER_CLOCK_EVERY = 60.0

logger = logging.getLogger(__name__)


class QoS(redis.QoS):
    _clock_offset: float | None = None  # this host's clock minus the Redis server's
    _clock_read_at = 0.0  # time.monotonic() of the last read

    def broker_now(self, client=None) -> float:
        """The Redis server's time, by this host's clock and the offset read at most
        BROKER_CLOCK_EVERY seconds ago (one `TIME` a minute, not one per message)."""
        if (
            self._clock_offset is None
            or time.monotonic() - self._clock_read_at > BROKER_CLOCK_EVERY
        ):
            with self.channel.conn_or_acquire(client) as conn:  # type: ignore[attr-defined]  # no stub
                seconds, micros = conn.time()
            self._clock_offset = time.time() - (seconds + micros / 1e6)
            self._clock_read_at = time.monotonic()
        return time.time() - self._clock_offset

    def append(self, message, delivery_tag):
        """kombu's, the unacknowledged message scored by the Redis server's clock."""
        delivery = message.delivery_info
        exchange, routing_key = delivery["exchange"], delivery["routing_key"]
        with self.pipe_or_acquire() as pipe:
            pipe.zadd(self.unacked_index_key, {delivery_tag: self.broker_now()}).hset(
                self.unacked_key, delivery_tag, dumps([message._raw, exchange, routing_key])
            ).execute()
            virtual.QoS.append(self, message, delivery_tag)

    def restore_visible(self, start=0, num=10, interval=10):
        """kombu's, its bound (now - visibility timeout) by the Redis server's clock."""
        self._vrestore_count += 1  # type: ignore[attr-defined]  # kombu's, no stub
        if (self._vrestore_count - 1) % (interval or 1):  # type: ignore[attr-defined]
            return
        with self.channel.conn_or_acquire() as client:  # type: ignore[attr-defined]  # no stub
            ceil = self.broker_now(client) - self.visibility_timeout
            try:
                with redis.Mutex(client, self.unacked_mutex_key, self.unacked_mutex_expire):
                    visible = client.zrange(
                        self.unacked_index_key, ceil, 0, desc=True, byscore=True,
                        offset=num and start, num=num, withscores=True,
                    )  # fmt: skip
                    for tag, _score in visible or []:
                        self.restore_by_tag(tag, client)
            except redis.MutexHeld:
                pass

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
