"""Due work: every piece of pending, retried work is a row (docs/architecture.md, "Due work").

The broker is a doorbell, the database is the ledger. A kind of due work
(settlements, outbox messages, refunds, compensation steps, shopper mails, webhook
deliveries) is a concrete model inheriting `DueWork`, with a `due_policy()`
naming its Celery task, attempt budget, backoff and lease. Everything below
takes the model class and row ids, never instances, and judges time by the
database's clock (`now()`), never the worker's.

    lease_due          beat sweeper: lease due rows (FOR UPDATE SKIP LOCKED), return ids
    sweep              lease_due + enqueue the task for each id, topping its queue up
                       to one batch (sweep_room: a long queue gets no more rings)
    queued, queued_tasks   how many messages wait in a task's queue; whose tasks they are
                       (Redis, without taking them: one consumer's ring among several)
    attempt_begin      count one attempt, take the attempt's lease (its worst case) and
                       push next_attempt_at back by the backoff, before the work calls out;
                       exactly one runner wins, and none while an attempt's lease runs
    attempts_begin, attempts_done, attempts_give_back, attempts_spent
                       the same for a ring of rows worked in order, one statement each
    attempt_failed     record the error, free the lease; spent budget -> needs_attention
    mark_done          the work is done (done_at), nothing is due any more
    flag_attention     stop retrying, staff decide (needs_attention + reason)
    fence              a queryset narrowed to "this attempt still holds the row"

Every write of an attempt takes the `Attempt` that `attempt_begin` returned
(`attempt=`): it is conditional on the attempt's fencing token, so a stale
runner (its lease run out, another attempt begun) changes nothing. The kind's
own columns (a status) go in the same UPDATE (`values=`, `attention_values=`,
`retry_values=`), so the flag and the status never commit apart.
    retry_now          staff: fresh budget, due now, ring the bell after commit
    leave_for_sweep    a task rung for rows leaves some untried: the next sweep rings them
    ring, ring_after_commit   the doorbell: the task by id, best effort (later: database clock);
                       the row is leased as a sweep leases it, so no sweep rings it again
                       while the ring is on its way
    backoff, countdown, retry_countdown   the one backoff (with jitter) and its Celery cap
    retry_eta          a task's own Celery retry, timed by the database clock

The sections are modules: `rows` (the row, its policy), `timing` (backoff and
countdowns), `sweeper` (lease and sweep), `attempts` (one attempt) and
`doorbell` (the ring). Callers use this package's names. It imports no other
project app.
"""

from .attempts import (
    Attempt,
    Ended,
    attempt_begin,
    attempt_failed,
    attempt_token,
    attempts_begin,
    attempts_done,
    attempts_give_back,
    attempts_spent,
    fence,
    flag_attention,
    mark_done,
    retry_now,
)
from .doorbell import (
    RING_OWNER_PREFIX,
    lease_for_ring,
    leave_for_sweep,
    release_ring_lease,
    ring,
    ring_after_commit,
    ring_many_after_commit,
    ring_owner,
    rings_paused,
)
from .rows import (
    ATTEMPT_OWNER_PREFIX,
    LAST_ERROR_MAX,
    DuePolicy,
    DueWork,
    DueWorkQuerySet,
    default_owner,
    due_index,
    truncate_error,
)
from .sweeper import ANY_TASK, lease_due, queue_of, queued, queued_tasks, sweep, sweep_room
from .timing import (
    RETRY_BACKOFF_CAP,
    backoff,
    countdown,
    max_countdown,
    retry_countdown,
    retry_eta,
)

__all__ = [
    "ANY_TASK",
    "ATTEMPT_OWNER_PREFIX",
    "LAST_ERROR_MAX",
    "RETRY_BACKOFF_CAP",
    "RING_OWNER_PREFIX",
    "Attempt",
    "DuePolicy",
    "DueWork",
    "DueWorkQuerySet",
    "Ended",
    "attempt_begin",
    "attempt_failed",
    "attempt_token",
    "attempts_begin",
    "attempts_done",
    "attempts_give_back",
    "attempts_spent",
    "backoff",
    "countdown",
    "default_owner",
    "due_index",
    "fence",
    "flag_attention",
    "lease_due",
    "lease_for_ring",
    "leave_for_sweep",
    "mark_done",
    "max_countdown",
    "queue_of",
    "queued",
    "queued_tasks",
    "release_ring_lease",
    "retry_countdown",
    "retry_eta",
    "retry_now",
    "ring",
    "ring_after_commit",
    "ring_many_after_commit",
    "ring_owner",
    "rings_paused",
    "sweep",
    "sweep_room",
    "truncate_error",
]
