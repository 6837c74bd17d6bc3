"""Reads of the reports app: the report days waiting for a person ("Needs attention")."""

from __future__ import annotations

from django.db.models import QuerySet

from core import attention

from .models import ReportDay


def days_needing_attention() -> QuerySet[ReportDay]:
    """Report days past their attempt budget, not made."""
    return ReportDay.objects.filter(needs_attention=True, done_at__isnull=True)


def needs_attention_counts() -> dict[str, int]:
    """{kind: rows} for this app's kind of "Needs attention" (report_day)."""
    return {attention.REPORT_DAY: days_needing_attention().count()}


def needs_attention_items(*, limit: int = attention.PAGE_LIMIT) -> list[attention.AttentionItem]:
    """Report days that could not be made, oldest flag first."""
    return [
        attention.AttentionItem(
            kind=attention.REPORT_DAY,
            pk=str(day.pk),
            what=f"sales report of {day.date.isoformat()} ({day.attempts} attempts)",
            reason=day.last_error,
            age=day.waiting,
            state=attention.row_state(day),
        )
        for day in attention.with_age(days_needing_attention())[:limit]
    ]
