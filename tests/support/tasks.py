"""The test-only due-work kind's task: one attempt at a chore, by id (core.due's shape)."""

from celery import shared_task

from core import due

from .models import DueChore


@shared_task(bind=True, name="testsupport.work_chore", max_retries=0)
def work_chore(self, chore_id: int) -> str:
    """Take one attempt at a due chore; a chore labelled "fail" always fails."""
    attempt = due.attempt_begin(DueChore, pk=chore_id)
    if attempt.budget_spent:
        due.flag_attention(DueChore, pk=chore_id, reason="attempt budget spent")
    if not attempt.taken:
        return "not due"
    if DueChore.objects.get(pk=chore_id).label == "fail":
        due.attempt_failed(DueChore, pk=chore_id, error="chore failed")
        return "failed"
    due.mark_done(DueChore, pk=chore_id)
    return "done"
