"""Celery: the broker, its timings, the queues and routes, and the beat schedule's helper.

Imported by base.py, which adds each app's beat entries next to that app's
own settings (their intervals live there).
"""

from kombu import Exchange, Queue

from .environment import env
from .servers import REDIS_URL

# --- Celery (see docs/celery.md for why each value is what it is) -------------
# The broker: Redis (REDIS_URL, the default) or RabbitMQ (`amqp://`, `amqps://`,
# `pyamqp://`). Redis stays the cache and throttle store either way.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
BROKER_IS_REDIS = CELERY_BROKER_URL.startswith(("redis://", "rediss://"))
BROKER_IS_AMQP = CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://"))
if not (BROKER_IS_REDIS or BROKER_IS_AMQP):
    raise ValueError(
        "CELERY_BROKER_URL must be redis://, rediss://, amqp://, amqps:// or pyamqp://,"
        f" not {CELERY_BROKER_URL.split('://')[0]}://"
    )
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A lost broker: the worker reconnects by itself, however long the broker is
# gone (retries every 2, 4, ... at most 30 s, forever).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
# The redelivery window (seconds). On Redis it is the visibility timeout: an
# unacked message older than this is handed to a second worker. RabbitMQ has
# none (it redelivers when the holding channel closes), but the same number
# bounds countdowns, time limits and leases there, so both brokers keep the
# same timings (docs/celery.md, "RabbitMQ").
CELERY_VISIBILITY_TIMEOUT = env.int("CELERY_VISIBILITY_TIMEOUT", default=60)
CELERY_UNACKED_RESTORE_INTERVAL = env.int("CELERY_UNACKED_RESTORE_INTERVAL", default=5)
CELERY_BROKER_TRANSPORT_OPTIONS: dict = {}
if BROKER_IS_REDIS:
    # kombu's Redis transport with the fix for its crash on a lost connection
    # (core/patches/redis_transport.py); ack emulation with a short visibility timeout.
    CELERY_BROKER_TRANSPORT = "core.patches.redis_transport:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # A broker that hangs (SIGSTOP, a partition): a publish fails after
        # this instead of holding the request that rings (the row stays due;
        # the sweeper rings again). 1 s: a request makes a publish or two,
        # and at 5 s each a hung Redis holds every web thread
        # (docs/failure-model.md, "What broke, and what fixed it").
        # A worker raises it (BROKER_WORKER_SOCKET_TIMEOUT, config/celery.py):
        # its consumer waits in BRPOP 1 s at a time, which 1 s would trip.
        "socket_connect_timeout": env.float("REDIS_CONNECT_TIMEOUT", default=1.0),
        "socket_timeout": env.float("BROKER_SOCKET_TIMEOUT", default=1.0),
        # A publisher's channel is opened once, with no reconnect loop (kombu's
        # default retries for the broker connection timeout, 4 s): the ring
        # fails and the sweeper rings again. A worker keeps its retries
        # (config/celery.py; its consumer reconnects forever by itself).
        "max_retries": 0,
        "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
        "unacked_restore_interval": CELERY_UNACKED_RESTORE_INTERVAL,
        "unacked_restore_throttle": env.int("CELERY_UNACKED_RESTORE_THROTTLE", default=1),
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Publisher confirms: every publish waits for the broker's ack, so a
        # message the broker refused or lost before taking it raises in the
        # publisher (the due row stays due and the sweeper rings again)
        # instead of vanishing silently.
        "confirm_publish": True,
    }
    # AMQP heartbeats: a half-open connection (a partitioned worker) is closed
    # by the broker after about two missed beats, which redelivers its unacked
    # messages; the worker notices and reconnects just as soon.
    CELERY_BROKER_HEARTBEAT = env.int("CELERY_BROKER_HEARTBEAT", default=20)
    CELERY_BROKER_CONNECTION_TIMEOUT = env.float("CELERY_BROKER_CONNECTION_TIMEOUT", default=4.0)
    # A lost connection returns every unacked message to the queue at once;
    # cancel the acks_late tasks still running on it rather than run them next
    # to their redelivered copies (both would be safe; one is cheaper).
    CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# A worker's broker socket timeout (Redis): above its BRPOP poll (1 s), so an
# idle worker's poll never trips it.
BROKER_WORKER_SOCKET_TIMEOUT = env.float("BROKER_WORKER_SOCKET_TIMEOUT", default=5.0)
# Seconds a process stops ringing after a ring failed (core.due.ring): a hung
# broker costs one request one socket timeout, not every request each one.
# The rows rung for meanwhile are found by their sweepers when due.
BROKER_RING_PAUSE = env.float("BROKER_RING_PAUSE", default=10.0)
# Seconds a publish may wait for the broker (the socket write, and on RabbitMQ
# the publisher confirm): a broker under a memory alarm blocks publishers
# without closing the connection, and without this bound the request that
# publishes would wait for the alarm to clear. The publish then raises; its
# work is a due row, rung again by the sweeper (config/celery.py).
BROKER_PUBLISH_TIMEOUT = env.float("BROKER_PUBLISH_TIMEOUT", default=3.0)
# No Celery countdown, ETA or retry delay may reach the redelivery window;
# longer waits are rows with next_attempt_at swept by beat.
CELERY_MAX_COUNTDOWN = CELERY_VISIBILITY_TIMEOUT // 3
# Nor may a task run into it (Redis would hand its message to a second
# worker), even after the longest countdown: a message is unacked from
# delivery (its countdown included) until the task ends. The soft limit
# raises inside the task, the hard one kills its process; long work is batched
# with a time budget below them (IDEMPOTENCY_COMPLETER_BUDGET). On RabbitMQ
# the same limits keep every delivery far below its consumer_timeout (30 min).
CELERY_TASK_TIME_LIMIT = CELERY_VISIBILITY_TIMEOUT - CELERY_MAX_COUNTDOWN - 5
CELERY_TASK_SOFT_TIME_LIMIT = CELERY_TASK_TIME_LIMIT - 5
# An attempt's lease (core.due, DuePolicy.attempt_lease) is its worst case, so that no
# second attempt of a due row begins while the first can still be running; each kind
# derives it from its calls' timeouts, plus this margin for the database around them.
DUE_ATTEMPT_MARGIN = env.float("DUE_ATTEMPT_MARGIN", default=5.0)
CELERY_BEAT_SCHEDULE: dict = {}


def _beat_every(task: str, seconds: float) -> dict:
    """Return a beat entry running `task` every `seconds`.

    Every periodic task expires after one interval: after a worker outage the
    queued ticks are dropped, not run back to back.
    """
    return {"task": task, "schedule": seconds, "options": {"expires": seconds}}


CELERY_TIMEZONE = "UTC"

# Queues by kind of work (docs/celery.md, "Queues"): a worker started with
# `-Q <queue>` runs one kind only, so a slow nightly report or a burst of e-mails
# never waits in line before a settlement. Every task is named here (a test
# fails on one that is not); a worker started without `-Q` (make run, the tests)
# consumes all of them.
SHOP_QUEUES: dict[str, tuple[str, ...]] = {
    # What a shopper's money waits for: settling a lost answer, a refund.
    "checkout": ("payments.settle_payment", "payments.refund"),
    # The outbox's consumers and the relay's fallbacks (publish, re-publish overdue).
    "events": (
        "shop.consume_loyalty",
        "shop.consume_history",
        "shop.consume_emails",
        "idempotency.relay_outbox",
        "idempotency.sweep_deliveries",
    ),
    # Work after the fact that talks to a mail server: one step of a cancellation's or a
    # return's compensation run (its notify step sends mail), and the shopper e-mails the
    # "emails" consumer wrote (shop.send_mail): slow sends never queue before a delivery.
    "compensation": ("orders.compensation_step", "shop.send_mail"),
    # The sales report: the run that makes every closed day (reports.make_days), and a
    # day's chain of steps.
    "reports": (
        "reports.make_days",
        "reports.extract",
        "reports.aggregate",
        "reports.publish",
    ),
    # Beat's sweeps and clean-ups: each finds due rows and rings their own queue
    # (or finishes abandoned request keys within its time budget).
    "maintenance": (
        "payments.sweep_settlements",
        "payments.sweep_refunds",
        "orders.sweep_compensation",
        "shop.sweep_mail",
        "shop.purge_mail",
        "shop.purge_api_tokens",
        "orders.expire_reservations",
        "idempotency.complete_abandoned_keys",
        "idempotency.purge_outbox",
        "idempotency.purge_inbox",
        "idempotency.purge_finished_keys",
        "core.clear_expired_sessions",
    ),
}
# Each queue is bound to its own direct exchange under its own name, as Celery's
# default queue is: the same layout on Redis and RabbitMQ (durable there).
CELERY_TASK_QUEUES = tuple(
    Queue(name, Exchange(name, type="direct"), routing_key=name) for name in SHOP_QUEUES
)
CELERY_TASK_ROUTES = {
    task: {"queue": queue} for queue, tasks in SHOP_QUEUES.items() for task in tasks
}
# A task someone forgets to route still lands on a queue every worker layout consumes.
CELERY_TASK_DEFAULT_QUEUE = "maintenance"
