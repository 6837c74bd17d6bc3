"""The Redis transport judges the visibility timeout by the Redis server's clock
(core/patches/redis_transport.py), not by each host's.

A consumer on a host 5 minutes ahead (the chaos run's host b) takes a message and
dies holding it; a worker on a host with the right clock must hand it out again
once the visibility timeout has passed. kombu's own QoS (the wrong twin) scores the
message by the dead consumer's clock: 5 minutes in the future, so it stays hidden
5 minutes longer.
"""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from kombu import Connection, Exchange, Queue
from kombu.transport import redis as kombu_redis

from core.patches import redis_transport

VISIBILITY = 1.0
AHEAD = 300.0


def _connection(qos_class: type) -> Connection:
    transport = type("T", (redis_transport.Transport,), {})
    transport.Channel = type("C", (redis_transport.Channel,), {"QoS": qos_class})
    url = settings.REDIS_URL.rsplit("/", 1)[0] + "/7"  # a database of its own
    return Connection(
        url, transport=transport, transport_options={"visibility_timeout": VISIBILITY}
    )


def _restored_after_the_timeout(qos_class: type, monkeypatch) -> bool:
    queue = Queue("redis-transport-test", Exchange("redis-transport-test"), "rt")
    with _connection(qos_class) as conn:
        channel = conn.channel()
        bound = queue(channel)
        bound.declare()
        bound.purge()
        conn.Producer(channel).publish({"n": 1}, exchange=queue.exchange, routing_key="rt")
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + AHEAD)
        monkeypatch.setattr(kombu_redis, "time", lambda: real() + AHEAD)
        taken = bound.get(no_ack=False)  # host b's consumer takes it, then dies
        assert taken is not None
        monkeypatch.undo()  # this host's clock is right again
        channel.qos._delivered.clear()  # the dead consumer acknowledges nothing
        time.sleep(VISIBILITY + 0.5)
        restorer = conn.channel()
        restorer.qos.restore_visible(interval=1)
        again = queue(restorer).get(no_ack=True)
        queue(restorer).purge()
        return again is not None


@pytest.mark.skipif(not settings.BROKER_IS_REDIS, reason="the broker is not Redis")
def test_a_message_held_by_a_dead_consumer_on_a_host_ahead_is_handed_out_after_the_timeout(
    monkeypatch,
):
    assert _restored_after_the_timeout(redis_transport.QoS, monkeypatch)


@pytest.mark.skipif(not settings.BROKER_IS_REDIS, reason="the broker is not Redis")
def test_wrong_twin_kombus_own_qos_hides_it_for_as_long_as_the_host_was_ahead(monkeypatch):
    assert not _restored_after_the_timeout(kombu_redis.QoS, monkeypatch)
