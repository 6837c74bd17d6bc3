"""The daily sales report: two intermediate tables (one per step) and the published figures.

Each step of the pipeline (extract → aggregate → publish, docs/reports.md)
owns one table and, for its day, deletes its own rows and writes them
again, so a step re-run after a crash gives exactly what a clean run gives.
"""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from core.due import DuePolicy, DueWork, due_index


class ReportExtractRow(models.Model):
    """One fact of one day, as the extract step read it (a sold line, a refund, returned units)."""

    class Source(models.TextChoices):
        SALE = "sale", pgettext_lazy("report source", "Sale")
        # a succeeded refund: money back, per order
        REFUND = "refund", pgettext_lazy("report source", "Refund")
        # units received back, per order and sku
        RETURN = "return", pgettext_lazy("report source", "Return")

    date = models.DateField(verbose_name=_("date"))
    source = models.CharField(max_length=16, choices=Source.choices, verbose_name=_("source"))
    order_id = models.UUIDField(verbose_name=_("order id"))
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    units = models.IntegerField(verbose_name=_("units"))
    amount = models.DecimalField(max_digits=14, decimal_places=2, verbose_name=_("amount"))

    class Meta:
        verbose_name = _("report extract row")
        verbose_name_plural = _("report extract rows")
        constraints = [
            # A second extract for the day can never add to the first one's rows.
            models.UniqueConstraint(
                fields=["date", "source", "order_id", "sku"], name="reports_extract_fact_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.date} {self.source} {self.sku} × {self.units}"


class ReportAggregate(models.Model):
    """The aggregate step's output for one day: the figures and their content hash."""

    date = models.DateField(verbose_name=_("date"))
    orders = models.IntegerField(verbose_name=_("orders"))
    units = models.IntegerField(verbose_name=_("units"))
    revenue = models.DecimalField(max_digits=16, decimal_places=2, verbose_name=_("revenue"))
    refunds = models.DecimalField(max_digits=16, decimal_places=2, verbose_name=_("refunds"))
    returns = models.IntegerField(verbose_name=_("returns"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    content_hash = models.CharField(max_length=64, verbose_name=_("content hash"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("report aggregate")
        verbose_name_plural = _("report aggregates")
        constraints = [
            models.UniqueConstraint(fields=["date"], name="reports_reportaggregate_date_uniq"),
        ]

    def __str__(self) -> str:
        return gettext("aggregate {date}").format(date=self.date)


DAILY_SALES_DATE_CONSTRAINT = "reports_dailysalesreport_date_uniq"


class DailySalesReport(models.Model):
    """The published report of one closed day; one row per day, replaced in place by revision.

    The unique constraint on `date` (not a check in code) makes two runs at
    once publish one report. A re-run whose figures differ (new data for a
    past day) replaces them: `revision` + 1, `replaced_at`, and the hash it
    replaced in `previous_content_hash`; identical figures change nothing.
    """

    date = models.DateField(verbose_name=_("date"))
    orders = models.IntegerField(verbose_name=_("orders"))
    units = models.IntegerField(verbose_name=_("units"))
    revenue = models.DecimalField(max_digits=16, decimal_places=2, verbose_name=_("revenue"))
    refunds = models.DecimalField(max_digits=16, decimal_places=2, verbose_name=_("refunds"))
    returns = models.IntegerField(verbose_name=_("returns"))
    currency = models.CharField(max_length=3, verbose_name=_("currency"))
    content_hash = models.CharField(max_length=64, verbose_name=_("content hash"))
    revision = models.PositiveIntegerField(default=1, verbose_name=_("revision"))
    published_at = models.DateTimeField(db_default=Now(), verbose_name=_("published at"))
    replaced_at = models.DateTimeField(null=True, blank=True, verbose_name=_("replaced at"))
    previous_content_hash = models.CharField(
        max_length=64, null=True, blank=True, verbose_name=_("previous content hash")
    )

    class Meta:
        verbose_name = _("daily sales report")
        verbose_name_plural = _("daily sales reports")
        constraints = [
            models.UniqueConstraint(fields=["date"], name=DAILY_SALES_DATE_CONSTRAINT),
            models.CheckConstraint(
                condition=Q(revision=1, replaced_at__isnull=True)
                | Q(revision__gt=1, replaced_at__isnull=False),
                name="reports_dailysalesreport_revision_replaced",
            ),
        ]

    def __str__(self) -> str:
        return gettext("sales {date} (revision {revision})").format(
            date=self.date, revision=self.revision
        )


REPORT_DAY_CONSTRAINT = "reports_reportday_date_uniq"


class ReportDay(DueWork):
    """One closed day the sales report must make: due work (`core.due`), done once published.

    The run (`reports.days.days_make`) opens a row per closed day from the
    first day on (one `INSERT ... ON CONFLICT` on the date: two runs open one
    row) and makes the due ones, oldest first; the publish step marks the
    day's row done in its own transaction, whoever ran it (the run, the
    command). Past its attempt budget a day needs attention ("Needs
    attention": Retry now). docs/reports.md, "Every closed day, once (catch-up)".
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    date = models.DateField(verbose_name=_("date"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("report day")
        verbose_name_plural = _("report days")
        constraints = [models.UniqueConstraint(fields=["date"], name=REPORT_DAY_CONSTRAINT)]
        indexes = [due_index(name="reports_day_due_idx")]

    def __str__(self) -> str:
        return gettext("sales report of {date}").format(date=self.date.isoformat())

    @classmethod
    def due_policy(cls) -> DuePolicy:
        # The bell rings the run (`reports.make_days`): it makes every due day, oldest first.
        # One attempt runs in one task: the hard time limit bounds it.
        return DuePolicy.from_settings(
            "REPORTS_DAY",
            task="reports.make_days",
            attempt_lease=settings.REPORTS_DAY_ATTEMPT_LEASE,
        )
