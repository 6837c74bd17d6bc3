"""Compensation: undoing a confirmed order's effects by new, forward steps (docs/compensation.md).

What other modules use; the rest stays inside the package:

    run       starting a compensation (`steps_insert`) and running its
              attempts (`step_run`, `steps_sweep`)
    state     a step row's shared transitions (done, waiting, needs attention)
    steps     the restock, event and e-mail steps
    refund    the refund step and its derived refund ids
    staff     staff's actions (retry failed steps)
"""

from .refund import cancellation_refund_id, return_refund_id, step_refund_id
from .run import step_run, steps_insert, steps_sweep
from .staff import (
    cancellation_retry_failed_steps,
    return_retry_failed_steps,
    steps_retry_failed,
)
from .state import StepNeedsAttention

__all__ = [
    "StepNeedsAttention",
    "cancellation_refund_id",
    "cancellation_retry_failed_steps",
    "return_refund_id",
    "return_retry_failed_steps",
    "step_refund_id",
    "step_run",
    "steps_insert",
    "steps_retry_failed",
    "steps_sweep",
]
