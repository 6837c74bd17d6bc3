"""The keyed stock adjustment (`stock.adjust`): one phase, a domain result, the caller's answer.

The phase changes the stock and stores the answer the caller's presenter
makes of the stock item (the API's: inventory/api/presenters.py), in the same
transaction. A refusal (stock_below_reserved, stock_limit_exceeded) is raised
before anything commits and answered through the same presenter. An
abandoned key committed nothing: the completer forgets it
(idempotency.keys.single_phase_resume).
"""

from __future__ import annotations

from idempotency.keys import KeyRun, Presenter, Result, close_run, keyed_phase

from .services import stock_adjust, stock_adjust_by_staff

STOCK_ADJUST = "stock.adjust"
ADJUSTED = "adjusted"


def stock_adjust_keyed(
    *, run: KeyRun, present: Presenter, sku: str, delta: int | None, set_to: int | None
) -> None:
    """Adjust stock under a request key: one phase storing the answer with the change."""
    with keyed_phase(run, present, next_point=ADJUSTED):
        stock = stock_adjust(sku=sku, delta=delta, set_to=set_to)
        close_run(run, Result.done(stock), present)


def stock_adjust_by_staff_keyed(
    *,
    run: KeyRun,
    present: Presenter,
    sku: str,
    delta: int | None,
    set_to: int | None,
    reason: str,
    by,
    form_scope: str | None = None,
) -> None:
    """The admin's "Adjust stock": the same one phase, with the reason in the admin history
    and the form's scope (`stock_adjust_by_staff`: one adjustment per form shown)."""
    with keyed_phase(run, present, next_point=ADJUSTED):
        stock = stock_adjust_by_staff(
            sku=sku, delta=delta, set_to=set_to, reason=reason, by=by, form_scope=form_scope
        )
        close_run(run, Result.done(stock), present)
