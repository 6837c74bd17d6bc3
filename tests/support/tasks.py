"""Test-only tasks: one attempt at a due chore (core.due's shape), and a long-running one."""

import time
from pathlib import Path

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


@shared_task(bind=True, name="testsupport.linger", max_retries=0)
def linger(self, started_file: str, seconds: float) -> str:
    """Write `started_file`, then run for `seconds`: a task a warm shutdown waits for."""
    Path(started_file).write_text("started")
    time.sleep(seconds)
    return "lingered"
