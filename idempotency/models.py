"""Request keys, the outbox and the inbox."""

import uuid

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Now
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.due import DuePolicy, DueWork, due_index

STARTED = "started"
FINISHED = "finished"


class IdempotencyKey(models.Model):
    """One client's `Idempotency-Key`: the request it names, how far it got, its answer.

    The row is inserted first (the unique (owner, key) constraint decides who
    runs); each phase of the operation commits its effects together with the
    next `recovery_point` and `data`, but only while `leased_by` still holds
    the running request's fencing token. Once `recovery_point` is
    `finished` the stored response is replayed forever (until purged).
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        related_name="+",
        verbose_name=_("owner"),
    )
    key = models.CharField(max_length=255, verbose_name=_("key"))
    operation = models.CharField(max_length=100, verbose_name=_("operation"))
    request_method = models.CharField(max_length=10, verbose_name=_("request method"))
    request_path = models.CharField(max_length=2048, verbose_name=_("request path"))
    # SHA-256 (hex) of the body's canonical JSON; method and path are compared as well.
    request_fingerprint = models.CharField(max_length=64, verbose_name=_("request fingerprint"))
    recovery_point = models.CharField(
        max_length=64, default=STARTED, db_default=STARTED, verbose_name=_("recovery point")
    )
    data = models.JSONField(default=dict, encoder=DjangoJSONEncoder, verbose_name=_("data"))
    # Fencing token of the request (or completer) that holds the key's lease; null when none.
    leased_by = models.UUIDField(null=True, blank=True, verbose_name=_("leased by"))
    leased_at = models.DateTimeField(null=True, blank=True, verbose_name=_("leased at"))
    runs = models.PositiveIntegerField(default=1, verbose_name=_("runs"))
    response_status = models.PositiveSmallIntegerField(
        null=True, blank=True, verbose_name=_("response status")
    )
    # The exact bytes sent the first time (as text), so that a replay is byte-identical.
    response_body = models.TextField(null=True, blank=True, verbose_name=_("response body"))
    response_headers = models.JSONField(default=dict, verbose_name=_("response headers"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    last_run_at = models.DateTimeField(db_default=Now(), verbose_name=_("last run at"))
    finished_at = models.DateTimeField(null=True, blank=True, verbose_name=_("finished at"))

    class Meta:
        verbose_name = _("idempotency key")
        verbose_name_plural = _("idempotency keys")
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "key"], name="idempotency_idempotencykey_owner_key_uniq"
            ),
            models.CheckConstraint(
                condition=Q(leased_by__isnull=True, leased_at__isnull=True)
                | Q(leased_by__isnull=False, leased_at__isnull=False),
                name="idempotency_idempotencykey_lease_complete",
            ),
            models.CheckConstraint(
                condition=~Q(recovery_point=FINISHED)
                | Q(
                    response_status__isnull=False,
                    finished_at__isnull=False,
                    leased_by__isnull=True,
                ),
                name="idempotency_idempotencykey_finished_has_answer",
            ),
        ]
        indexes = [
            # The purge walks finished keys by age.
            models.Index(
                fields=["finished_at"],
                condition=Q(recovery_point=FINISHED),
                name="idempotency_key_purge_idx",
            ),
            # The completer walks open keys by their last run.
            models.Index(
                fields=["last_run_at"],
                condition=~Q(recovery_point=FINISHED),
                name="idempotency_key_open_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation} {self.key} ({self.recovery_point})"


class OutboxMessage(DueWork):
    """An event to publish, written in the same transaction as the change it reports.

    Due work (`core.due`): the relay (`idempotency.messaging.relay`) claims rows whose
    `next_attempt_at` has come, oldest first per aggregate, publishes them
    and marks them done (`done_at`, i.e. `published_at`); a message that
    keeps failing past its attempt budget needs attention.
    """

    id = models.UUIDField(
        primary_key=True, default=uuid.uuid4, editable=False, verbose_name=_("id")
    )
    aggregate_type = models.CharField(max_length=100, verbose_name=_("aggregate type"))
    aggregate_id = models.CharField(max_length=100, verbose_name=_("aggregate id"))
    event_type = models.CharField(max_length=100, verbose_name=_("event type"))
    payload = models.JSONField(encoder=DjangoJSONEncoder, verbose_name=_("payload"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        indexes = [
            due_index(name="idempotency_outbox_due_idx"),
            models.Index(
                fields=["aggregate_type", "aggregate_id", "created_at"],
                name="idempotency_outbox_agg_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.aggregate_type}:{self.aggregate_id}"

    @property
    def published_at(self):
        """When the relay published the message (the due-work row's `done_at`)."""
        return self.done_at

    @classmethod
    def due_policy(cls) -> DuePolicy:
        # The relay process (`manage.py relay_outbox`) polls; beat's
        # `idempotency.relay_outbox` is the fallback. Nothing rings per row.
        return DuePolicy.from_settings("OUTBOX_RELAY", task=None)


class Delivery(DueWork):
    """One consumer's copy of one outbox message: written (committed) by the relay before it
    publishes, marked done by the consumer in the transaction of its effect.

    Due work (`core.due`): the relay leases the row for `OUTBOX_DELIVERY_TIMEOUT`
    when it publishes; a delivery not done when the lease ends (the broker lost
    the message, a worker died) is claimed by the delivery sweeper and rung
    again. `attempts` counts every run of the consumer task (a redelivery
    after a worker loss too); past the budget, or at once for a message the
    consumer can never apply, it is a **dead letter** (`needs_attention`, the
    reason in `last_error`) until staff requeue it. `publishes` counts how
    often the relay or the sweeper put it on the broker.
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    consumer = models.CharField(max_length=100, verbose_name=_("consumer"))
    message = models.ForeignKey(
        OutboxMessage,
        on_delete=models.CASCADE,
        related_name="deliveries",
        verbose_name=_("message"),
    )
    publishes = models.PositiveIntegerField(default=0, db_default=0, verbose_name=_("publishes"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "message"], name="idempotency_delivery_consumer_message_uniq"
            ),
        ]
        indexes = [
            due_index(name="idempotency_delivery_due_idx"),
            models.Index(
                fields=["updated_at"],
                condition=Q(needs_attention=True, done_at__isnull=True),
                name="idempotency_delivery_dead_idx",
            ),
            # A ring's claim takes its consumer's oldest fresh rows (never tried) besides
            # its own (idempotency.messaging.deliveries, "claim").
            models.Index(
                fields=["consumer", "id"],
                condition=Q(attempts=0, done_at__isnull=True, needs_attention=False),
                name="idempotency_delivery_fresh_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.consumer}: {self.message_id}"

    @classmethod
    def due_policy(cls) -> DuePolicy:
        # The task depends on the consumer: rung through idempotency.messaging.relay's registry.
        return DuePolicy.from_settings(
            "OUTBOX_DELIVERY", task=None, lease=settings.OUTBOX_DELIVERY_TIMEOUT
        )


class DeadLetter(Delivery):
    """The admin's "Dead letters" list: deliveries that need attention (a proxy, no table)."""

    class Meta:
        proxy = True
        verbose_name = _("dead letter")
        verbose_name_plural = _("dead letters")


class InboxMessage(models.Model):
    """A message a consumer has processed; inserted first, in the consumer's own transaction.

    `consumer` is the source (e.g. `payments.provider` for the provider's
    webhooks), `message_id` the source's event id. Consumers that keep the
    message itself (webhooks) also store its `message_type`, `payload` and
    what became of it: `status` (`processed` for a plain claim; webhooks:
    `applied`, `no_effect`, `unmatched`, `ignored`, `suspicious`) and `detail`.
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    consumer = models.CharField(max_length=100, verbose_name=_("consumer"))
    message_id = models.CharField(max_length=255, verbose_name=_("message id"))
    received_at = models.DateTimeField(db_default=Now(), verbose_name=_("received at"))
    message_type = models.CharField(
        max_length=100, blank=True, default="", db_default="", verbose_name=_("message type")
    )
    payload = models.JSONField(
        default=dict, db_default={}, encoder=DjangoJSONEncoder, verbose_name=_("payload")
    )
    status = models.CharField(
        max_length=20, default="processed", db_default="processed", verbose_name=_("status")
    )
    detail = models.TextField(blank=True, default="", db_default="", verbose_name=_("detail"))
    # When an `unmatched` message was applied later (settlement met it).
    processed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("processed at"))

    class Meta:
        verbose_name = _("inbox message")
        verbose_name_plural = _("inbox messages")
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "message_id"],
                name="idempotency_inboxmessage_consumer_message_uniq",
            ),
        ]
        indexes = [
            # Settlement looks for a stored, not yet matched event by its provider key.
            models.Index(
                models.F("consumer"),
                KT("payload__data__provider_key"),
                condition=Q(status="unmatched"),
                name="idem_inbox_unmatched_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.consumer}: {self.message_id}"


class DuplicateCount(models.Model):
    """How many duplicates one mechanism suppressed on one (UTC) day, across every process.

    Written only by `idempotency.metrics.duplicate_suppressed`, one
    `INSERT ... ON CONFLICT (day, mechanism, suspicious) DO UPDATE SET
    count = count + n` per event, so concurrent processes never lose a count.
    `suspicious` rows count duplicates whose payload differed from the first
    one under the same id. Rows are never deleted: `/metrics` sums them into
    monotonic counters.
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    day = models.DateField(verbose_name=_("day"))
    mechanism = models.CharField(max_length=50, verbose_name=_("mechanism"))
    suspicious = models.BooleanField(default=False, verbose_name=_("suspicious"))
    count = models.BigIntegerField(default=0, verbose_name=_("count"))

    class Meta:
        verbose_name = _("duplicate count")
        verbose_name_plural = _("duplicates")
        constraints = [
            models.UniqueConstraint(
                fields=["day", "mechanism", "suspicious"],
                name="idempotency_duplicatecount_day_mechanism_uniq",
            ),
        ]

    def __str__(self) -> str:
        flag = gettext(" (suspicious)") if self.suspicious else ""
        return f"{self.day} {self.mechanism}{flag}: {self.count}"
