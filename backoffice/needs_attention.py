"""The admin's "Needs attention" page: every item waiting for a person, and what ends it.

One list across the apps (docs/operations.md, "Needs attention"): settlements
past their attempt budget and refunds in `needs_attention` (payments),
compensation steps that failed (orders), dead letters (idempotency), report
days that could not be made (reports). Each app lists its own rows
(`needs_attention_items()` in its selectors); this module, the top layer,
names what each belongs to (order number, return), offers the actions that
end it and counts the kinds for `shop_needs_attention{kind}`.

Every action is a POST form whose request key is derived from the item, the
action and the row's state as listed (`action_key`): a double click, a
refresh or the same page in two tabs runs the action once (the second post is
a replay of the first answer); a row that changed since gets a new key, and
the service's conditional transition decides (a second decision changes
nothing). A refusal is shown as an admin message with its title, on this page.
Each action requires the model permission it changes; the list shows only
the kinds the user may view.
"""

from __future__ import annotations

import datetime
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import Promise
from django.utils.translation import gettext, gettext_lazy

from core import attention
from idempotency import selectors as idempotency_selectors
from idempotency.admin_actions import ADMIN_NEEDS_ATTENTION
from idempotency.keys import Reply, Result, close_run, keyed_phase
from idempotency.messaging.deliveries import dead_letter_requeue
from idempotency.views import FORM_FIELD, form_redirect, idempotent_form
from orders import compensation
from orders import selectors as orders_selectors
from payments import capture_differs, refund_decisions
from payments import selectors as payments_selectors
from payments import settlement as payments_settlement
from payments.states import RefundStatus, SettlementAttention
from reports import days as report_days
from reports import selectors as reports_selectors


@dataclass(frozen=True)
class Kind:
    """One kind of item: its section's title, its model and how a form names its row."""

    title: str | Promise
    model: str  # "app_label.modelname": the permissions and the row's admin page follow
    pk_type: Callable[[str], object]  # how a form's pk is read (anything else is a 400)

    @property
    def view_permission(self) -> str:
        """The permission to see the kind (its model's "view")."""
        app, model = self.model.split(".")
        return f"{app}.view_{model}"

    @property
    def change_permission(self) -> str:
        """The permission every action on the kind needs (its model's "change")."""
        app, model = self.model.split(".")
        return f"{app}.change_{model}"

    @property
    def row_page(self) -> str:
        """The URL name of a row's own admin page."""
        return "admin:{}_{}_change".format(*self.model.split("."))


BY_KIND: dict[str, Kind] = {
    attention.SETTLEMENT: Kind(
        gettext_lazy("Settlements past their attempt budget"), "payments.paymentsettlement", int
    ),
    attention.REFUND: Kind(
        gettext_lazy("Refunds that need attention"), "payments.refund", uuid.UUID
    ),
    attention.STEP: Kind(
        gettext_lazy("Compensation steps that failed"), "orders.compensationstep", int
    ),
    attention.DEAD_LETTER: Kind(gettext_lazy("Dead letters"), "idempotency.deadletter", int),
    attention.REPORT_DAY: Kind(
        gettext_lazy("Report days that could not be made"), "reports.reportday", int
    ),
}
VIEW_PERMISSION = {kind: spec.view_permission for kind, spec in BY_KIND.items()}
ROW_PAGE = {kind: spec.row_page for kind, spec in BY_KIND.items()}
TITLES = {kind: spec.title for kind, spec in BY_KIND.items()}
PK_TYPES = {kind: spec.pk_type for kind, spec in BY_KIND.items()}


# --- The actions ------------------------------------------------------------------


def _settlement_retry(pk: str, by) -> bool:
    # settlement_retry_now answers with the row; "changed" is only for the message.
    waiting = payments_selectors.settlement_waiting_for_staff(settlement_id=pk)
    if waiting is None:
        return False  # no such row (a forged form): nothing to retry
    settlement = payments_settlement.settlement_retry_now(settlement_id=int(pk), by=by)
    return waiting and not settlement.needs_attention


def _service(module: ModuleType, name: str, field: str, cast: Callable = int):
    """An action's run: the staff service `module.name(<field>=cast(pk), by=staff)`, its
    answer taken as "changed". Looked up when the action runs, not when the table is built."""
    return lambda pk, by: getattr(module, name)(**{field: cast(pk)}, by=by)


@dataclass(frozen=True)
class Action:
    name: str
    label: str | Promise
    permission: str  # the model permission it changes
    run: Callable[[str, object], bool]  # (row pk, staff user) -> changed
    statuses: tuple[str, ...] = ()  # the row statuses it applies to (empty: any)
    explanation: str | Promise = ""
    also: tuple[str, ...] = ()  # further permissions it needs (a refund: `orders.refund_order`)

    def allowed(self, user) -> bool:
        """Whether `user` holds every permission this action needs."""
        return user.has_perms((self.permission, *self.also))


# Each kind's actions, one row each: (name, label, run, statuses, explanation, further
# permissions). Every action of a kind changes its model (`Kind.change_permission`).
_REFUND_WAITS = (RefundStatus.NEEDS_ATTENTION,)
_CAPTURED_OTHER = (SettlementAttention.CAPTURED_MORE, SettlementAttention.CAPTURED_LESS)
_ACTION_ROWS: dict[str, tuple[tuple, ...]] = {
    attention.SETTLEMENT: (
        (
            "retry",
            gettext_lazy("Retry now"),
            _settlement_retry,
            (),
            gettext_lazy("A fresh attempt budget, due now (the same provider key)."),
        ),
        (
            "record",
            gettext_lazy("Record what the provider captured"),
            _service(capture_differs, "settlement_record_provider_capture", "settlement_id"),
            _CAPTURED_OTHER,
            gettext_lazy(
                "The payment books the provider's amount and the order is paid "
                "(less than asked: the shop bears the shortfall; more: the shop keeps it)."
            ),
        ),
        (
            "refund_difference",
            gettext_lazy("Refund the difference"),
            _service(capture_differs, "settlement_refund_difference", "settlement_id"),
            (SettlementAttention.CAPTURED_MORE,),
            gettext_lazy(
                "The payment books the provider's amount, the order is paid and "
                "what the provider took over the amount asked is refunded."
            ),
            ("orders.refund_order",),
        ),
    ),
    attention.REFUND: (
        (
            "retry",
            gettext_lazy("Retry now"),
            _service(refund_decisions, "refund_retry_now", "refund_id", str),
            _REFUND_WAITS,
            gettext_lazy("Send the refund to the provider again (the same provider key)."),
        ),
        (
            "outside",
            gettext_lazy("Refunded outside the shop"),
            _service(refund_decisions, "refund_record_outside", "refund_id", str),
            _REFUND_WAITS,
            gettext_lazy("The money went back another way; the provider is not called."),
        ),
        (
            "failed",
            gettext_lazy("Record as failed"),
            _service(refund_decisions, "refund_record_failed", "refund_id", str),
            _REFUND_WAITS,
            gettext_lazy("The refund will not happen; its reserved amount is released."),
        ),
        (
            "accept_provider",
            gettext_lazy("Accept the provider's refund"),
            _service(refund_decisions, "refund_accept_provider", "refund_id", str),
            # Flagged after staff decided it: the provider reports it refunded after all.
            (RefundStatus.SUCCEEDED, RefundStatus.FAILED),
            gettext_lazy(
                "The provider's refund becomes the record (outside the shop: the "
                "outside payment was recovered or accepted; failed: it counts as refunded)."
            ),
        ),
    ),
    attention.STEP: (
        (
            "retry",
            gettext_lazy("Retry step"),
            _service(compensation, "steps_retry_failed", "step_ids", lambda pk: [int(pk)]),
            ("failed",),
            gettext_lazy("A fresh attempt budget, due now; its return goes back to processing."),
        ),
    ),
    attention.DEAD_LETTER: (
        (
            "requeue",
            gettext_lazy("Requeue"),
            lambda pk, by: dead_letter_requeue(int(pk)),
            (),
            gettext_lazy("A fresh attempt budget, published now (fix the cause first)."),
        ),
    ),
    attention.REPORT_DAY: (
        (
            "retry",
            gettext_lazy("Retry now"),
            _service(report_days, "day_retry_now", "day_id"),
            (),
            gettext_lazy(
                "A fresh attempt budget, due now: the run makes the day (fix the cause first)."
            ),
        ),
    ),
}
ACTIONS: dict[str, tuple[Action, ...]] = {
    kind: tuple(
        Action(name, label, BY_KIND[kind].change_permission, run, statuses, explanation, *also)
        for name, label, run, statuses, explanation, *also in rows
    )
    for kind, rows in _ACTION_ROWS.items()
}


def _valid_pk(kind: str, pk: str) -> bool:
    try:
        PK_TYPES[kind](pk)
    except (KeyError, ValueError):
        return False
    return True


def action_for(kind: str, name: str) -> Action | None:
    return next((a for a in ACTIONS.get(kind, ()) if a.name == name), None)


def actions_of(item: attention.AttentionItem) -> tuple[Action, ...]:
    """The actions that end this item (those that apply to its status)."""
    return tuple(
        a for a in ACTIONS.get(item.kind, ()) if not a.statuses or item.status in a.statuses
    )


def action_key(*, kind: str, pk: str, action: str, state: str) -> str:
    """The request key of one action form: the item, the action and the row's state as listed.

    Not random: the same page in two tabs (or rendered twice) carries the same
    key, so sending both is one action; the action moves the row's state, so
    the next listing gets a new key.
    """
    seed = f"{kind}|{pk}|{action}|{state}"
    return "admin-attention-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


# --- Reading ------------------------------------------------------------------------


def needs_attention_counts() -> dict[str, int]:
    """{kind: items} for every kind, counted in the database (`shop_needs_attention{kind}`)."""
    counts = dict.fromkeys(attention.KINDS, 0)
    counts |= payments_selectors.needs_attention_counts()
    counts |= orders_selectors.needs_attention_counts()
    counts |= idempotency_selectors.needs_attention_counts()
    counts |= reports_selectors.needs_attention_counts()
    return counts


def visible_kinds(user) -> list[str]:
    return [kind for kind in attention.KINDS if user.has_perm(VIEW_PERMISSION[kind])]


def _uuid(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class Row:
    item: attention.AttentionItem
    page: str  # the row's own admin page
    order_number: int | None
    order_page: str | None
    return_id: str | None
    return_page: str | None
    age: str
    actions: list[dict]
    # Some action ends this item, but not one this user may take.
    forbidden: bool = False


def age_text(age: datetime.timedelta) -> str:
    """ "2 d 3 h", "3 h 12 min", "4 min 5 s", "12 s": the two largest units."""
    seconds = max(0, int(age.total_seconds()))
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if seconds >= size or (unit == "s" and not parts):
            parts.append(f"{seconds // size} {unit}")
            seconds %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def needs_attention_rows(user) -> dict[str, list[Row]]:
    """{kind: rows} for the kinds `user` may view, each with what it belongs to and its actions."""
    kinds = visible_kinds(user)
    items: list[attention.AttentionItem] = []
    if attention.SETTLEMENT in kinds or attention.REFUND in kinds:
        items += payments_selectors.needs_attention_items()
    if attention.STEP in kinds:
        items += orders_selectors.needs_attention_items()
    if attention.DEAD_LETTER in kinds:
        items += idempotency_selectors.needs_attention_items()
    if attention.REPORT_DAY in kinds:
        items += reports_selectors.needs_attention_items()
    items = [i for i in items if i.kind in kinds]
    order_ids = {u for u in (_uuid(i.order_id) for i in items if i.order_id) if u}
    by_order, by_payment = orders_selectors.orders_for_attention(
        order_ids=order_ids, payment_ids={i.payment_id for i in items if i.payment_id}
    )
    returns = orders_selectors.returns_of_refunds(
        refund_ids={i.refund_id for i in items if i.kind == attention.REFUND}
    )
    rows: dict[str, list[Row]] = {kind: [] for kind in kinds}
    for item in items:
        order = by_order.get(_uuid(item.order_id)) if item.order_id else None
        order = order or by_payment.get(item.payment_id)
        return_id = item.return_id or returns.get(item.refund_id)
        rows[item.kind].append(
            Row(
                item=item,
                page=reverse(ROW_PAGE[item.kind], args=[item.pk]),
                order_number=order.number if order else None,
                order_page=reverse("admin:orders_order_change", args=[order.pk]) if order else None,
                return_id=str(return_id) if return_id else None,
                return_page=reverse("admin:orders_returnrequest_change", args=[return_id])
                if return_id
                else None,
                age=age_text(item.age),
                actions=[
                    {
                        "action": action,
                        "key": action_key(
                            kind=item.kind, pk=item.pk, action=action.name, state=item.state
                        ),
                    }
                    for action in actions_of(item)
                    if action.allowed(user)
                ],
                forbidden=any(not a.allowed(user) for a in actions_of(item)),
            )
        )
    return rows


# --- The views --------------------------------------------------------------------------


def present(result: Result) -> Reply:
    """303 back to the page: the action's outcome, or the refusal's title and detail."""
    if result.refusal is not None:
        refusal = result.refusal
        text = f"{gettext(refusal.default_title())}: {refusal.detail}"
        return form_redirect(reverse("admin-needs-attention"), message=text, level="error")
    return form_redirect(reverse("admin-needs-attention"), message=result.value)


@idempotent_form(operation=ADMIN_NEEDS_ATTENTION)
def _submit(request: HttpRequest, action: Action, pk: str, *, key) -> None:
    run = key.claim()
    with keyed_phase(run, present, next_point="done"):
        changed = action.run(pk, request.user)
        text = (
            gettext("{action}: done.").format(action=action.label)
            if changed
            else gettext("{action}: nothing changed (no longer waiting for this action).").format(
                action=action.label
            )
        )
        close_run(run, Result.done(text), present)


def needs_attention_view(request: HttpRequest) -> HttpResponse:
    """GET: the list; POST: one keyed action (kind, pk, action), then 303 back here."""
    if request.method == "POST":
        kind, pk = request.POST.get("kind", ""), request.POST.get("pk", "")
        action = action_for(kind, request.POST.get("action", ""))
        if action is None or not _valid_pk(kind, pk) or FORM_FIELD not in request.POST:
            return HttpResponseBadRequest("unknown action")
        if not action.allowed(request.user):
            raise PermissionDenied
        return _submit(request, action, pk)
    rows = needs_attention_rows(request.user)
    return TemplateResponse(
        request,
        "admin/needs_attention.html",
        {
            **admin.site.each_context(request),
            "title": gettext("Needs attention"),
            "sections": [
                {"kind": kind, "title": TITLES[kind], "rows": rows[kind]} for kind in rows
            ],
            "total": sum(len(r) for r in rows.values()),
            "field": FORM_FIELD,
        },
    )


def visible_count(user) -> int:
    """How many items `user` may see on the page (the admin index's link)."""
    counts = needs_attention_counts()
    return sum(counts[kind] for kind in visible_kinds(user))


def index_view(request: HttpRequest) -> HttpResponse:
    """The admin's index, with the "Needs attention" link and its count above the apps."""
    return admin.site.index(
        request,
        extra_context={
            "needs_attention_count": visible_count(request.user),
            "needs_attention_url": reverse("admin-needs-attention"),
        },
    )
