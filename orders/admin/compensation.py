"""Staff views of returns and compensation: read-only rows, keyed forms for every action.

"Mark received" and "Retry failed steps" (returns) and "Cancel order"
(orders) are each a small page whose form carries its own request key
(`{% idempotency_key_field %}`, idempotency.views.idempotent_form): a double
click of one form is a replay; two tabs, two staff, or the admin and the
warehouse scanner at once are decided by the services' conditional UPDATEs
(`return_receive`, `steps_retry_failed`, `order_cancel`): one run of steps.
"""

from __future__ import annotations

import functools
from decimal import Decimal

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext, gettext_lazy

from core.admin import DueWorkAdmin, ReadOnlyAdmin, ReadOnlyInline, require_permission
from core.money import format_money
from idempotency.admin_actions import (
    admin_form_refusal,
    keyed_action,
    redirect_to_value,
    refusal_message,
    state_key,
)
from idempotency.keys import Reply, Result, close_run, keyed_operation, keyed_phase
from idempotency.views import idempotent_form
from payments import selectors as payment_selectors

from .. import compensation, permissions, returns, services
from ..models import CompensationStep, Order, ReturnLine, ReturnRequest
from ..states import CompensationKind, Fulfillment, OrderStatus, StepStatus

ADMIN_RETURN_RECEIVE = "admin.return.receive"
ADMIN_RETURN_RETRY = "admin.return.retry"
ADMIN_ORDER_CANCEL = "admin.order.cancel"
ADMIN_RETURNS_RECEIVE = "admin.returns.receive"  # the bulk action's confirmation
keyed_operation(ADMIN_RETURNS_RECEIVE)(redirect_to_value)
DONE = "done"


def redirect_to(url_name: str):
    """A presenter answering 303 to the object's admin page.

    A refusal goes back to the page it came from (the object's, `pk`) with
    the problem's title as an admin message. The completer's copy (no
    request, no pk: it only forgets abandoned one-phase keys) has no page.
    """

    def present(result: Result, *, pk=None, request=None) -> Reply:
        value = result.value
        if result.refusal is not None:
            if request is not None:
                refusal_message(request, result.refusal)
            url = reverse(url_name, args=[pk]) if pk is not None else reverse("admin:index")
            return Reply(status=303, headers={"Location": url})
        return Reply(status=303, headers={"Location": reverse(url_name, args=[value.pk])})

    return present


return_redirect = keyed_operation(ADMIN_RETURN_RECEIVE, ADMIN_RETURN_RETRY)(
    redirect_to("admin:orders_returnrequest_change")
)
order_redirect = keyed_operation(ADMIN_ORDER_CANCEL)(redirect_to("admin:orders_order_change"))


def _back_to(present, request, obj):
    return functools.partial(present, pk=obj.pk, request=request)


# A key refused (in use, reused) goes back to the form's page with a message.
_keyed_form = functools.partial(idempotent_form, refusal=admin_form_refusal)


@_keyed_form(operation=ADMIN_RETURN_RECEIVE)
def _receive_submit(request, order_return, *, key):
    if key is None:
        return None
    run, present = key.claim(), _back_to(return_redirect, request, order_return)
    with keyed_phase(run, present, next_point=DONE):
        received = returns.return_receive(return_id=order_return.id, by=request.user)
        close_run(run, Result.done(received), present)


@_keyed_form(operation=ADMIN_RETURN_RETRY)
def _retry_submit(request, order_return, *, key):
    if key is None:
        return None
    run, present = key.claim(), _back_to(return_redirect, request, order_return)
    with keyed_phase(run, present, next_point=DONE):
        compensation.return_retry_failed_steps(return_id=order_return.id, by=request.user)
        close_run(run, Result.done(ReturnRequest.objects.get(id=order_return.id)), present)


@_keyed_form(operation=ADMIN_ORDER_CANCEL)
def _cancel_submit(request, order, *, key):
    if key is None:
        return None
    run, present = key.claim(), _back_to(order_redirect, request, order)
    with keyed_phase(run, present, next_point=DONE):
        services.order_cancel(order_id=order.id)
        close_run(run, Result.done(Order.objects.get(id=order.id)), present)


def cancel_explanation(order: Order) -> str:
    """What "Cancel order" will do to this order, as its confirmation page says it."""
    status = order.status
    if status == OrderStatus.AWAITING_DECISION:
        return gettext(
            "The order is cancelled at once: its reserved units go back to stock. "
            "Nothing was charged, so nothing is refunded."
        )
    if status in (OrderStatus.CONFIRMED, OrderStatus.PARTIALLY_CONFIRMED):
        if order.fulfillment != Fulfillment.UNFULFILLED:
            return gettext(
                "Part of this order has shipped: it cannot be cancelled; return it instead."
            )
        payment = order.payment
        captured = payment.amount_captured if payment is not None else Decimal(0)
        return gettext(
            "The order moves to cancelling. Compensation steps then refund what is still "
            "refundable of the {captured} {currency} captured, put its "
            "units back in stock, reverse its loyalty points and tell the shopper; when the "
            "last one is done the order is cancelled."
        ).format(captured=format_money(captured), currency=order.currency)
    if status in (OrderStatus.CANCELLING, OrderStatus.CANCELLED):
        return gettext(
            "The order is {status} already: cancelling it again changes nothing."
        ).format(status=status)
    if status == OrderStatus.PAYMENT_PENDING:
        return gettext("The payment's outcome is not known yet: cancel once it is.")
    return gettext("An order that is {status} cannot be cancelled.").format(status=status)


def cancel_form_key(order: Order, *, after: str = "") -> str:
    """The "Cancel order" form's key: the order's status as shown (see state_key)."""
    return state_key("cancel", order.id, order.status, after)


def _steps_table(steps) -> str:
    rows = [
        (
            reverse("admin:orders_compensationstep_change", args=[s.pk]),
            s.name,
            s.status,
            s.attempts,
            s.next_attempt_at,
            s.after or "-",
            str(s.refund_id or "-"),
            s.last_error or "",
        )
        for s in steps
    ]
    if not rows:
        return "-"
    body = format_html_join(
        "",
        '<tr class="step"><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td>'
        "<td>{}</td><td>{}</td><td>{}</td></tr>",
        rows,
    )
    return format_html(
        "<table><thead><tr><th>step</th><th>status</th><th>attempts</th><th>next attempt</th>"
        "<th>after</th><th>refund</th><th>last error</th></tr></thead><tbody>{}</tbody></table>",
        body,
    )


class ReturnLineInline(ReadOnlyInline):
    model = ReturnLine
    fields = ["sku", "quantity", "order_line"]
    readonly_fields = fields


@admin.register(ReturnRequest)
class ReturnRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "order", "status", "refund_amount", "currency", "created_at"]
    list_filter = ["status", "created_at"]
    list_select_related = ["order"]
    search_fields = ["=order__number", "order__owner__email"]
    ordering = ["-created_at"]
    fields = [
        "id",
        "order",
        "status",
        "reason",
        "refund_amount",
        "currency",
        "requested_by",
        "received_by",
        "received_at",
        "completed_at",
        "steps_table",
        "refund_row",
    ]
    readonly_fields = fields
    inlines = [ReturnLineInline]
    actions = ["mark_received", "retry_failed_steps"]
    change_form_template = "admin/orders/returnrequest/change_form.html"

    @admin.display(description=gettext_lazy("steps"))
    def steps_table(self, obj):
        return _steps_table(CompensationStep.objects.filter(order_return=obj).order_by("position"))

    @admin.display(description=gettext_lazy("refund"))
    def refund_row(self, obj):
        refund = payment_selectors.refund_get_or_none(
            refund_id=compensation.return_refund_id(obj.id)
        )
        if refund is None:
            return "-"
        url = reverse("admin:payments_refund_change", args=[refund.pk])
        return format_html(
            '<a href="{}">{}</a> {} {} {}',
            url,
            refund.pk,
            refund.amount,
            refund.currency,
            refund.status,
        )

    def _one(self, request, queryset, url_name):
        ids = list(queryset.values_list("id", flat=True)[:2])
        if len(ids) != 1:
            self.message_user(request, gettext_lazy("Select exactly one return."), level="warning")
            return None
        return HttpResponseRedirect(reverse(url_name, args=[ids[0]]))

    @admin.action(description=gettext_lazy("Mark received"), permissions=["change_state"])
    def mark_received(self, request, queryset):
        """Bulk: a keyed confirmation (keyed_action); each return is received at most once."""
        if not request.user.has_perm(permissions.RECEIVE_RETURN):
            raise PermissionDenied
        return keyed_action(
            self,
            request,
            queryset,
            operation=ADMIN_RETURNS_RECEIVE,
            title=gettext_lazy("Mark received"),
            explanation=gettext_lazy(
                "Record these returns as received in the warehouse. Each requested "
                "return starts its compensation (restock, refund, points, the shopper's e-mail) "
                "once; returns already received are left as they are."
            ),
            button=gettext_lazy("Yes, mark received"),
            decide=lambda pk: returns.return_receive(return_id=pk, by=request.user).started,
            done_message=lambda changed, skipped: gettext(
                "{changed} marked received; {skipped} unchanged (received already)."
            ).format(changed=changed, skipped=skipped),
        )

    @admin.action(description=gettext_lazy("Retry failed steps"), permissions=["change_state"])
    def retry_failed_steps(self, request, queryset):
        return self._one(request, queryset, "admin:orders_returnrequest_retry")

    def get_urls(self):
        def view(action):
            return self.admin_site.admin_view(functools.partial(self.action_view, action=action))

        return [
            path("<path:object_id>/receive/", view("receive"), name="orders_returnrequest_receive"),
            path("<path:object_id>/retry/", view("retry"), name="orders_returnrequest_retry"),
            *super().get_urls(),
        ]

    def action_view(self, request, object_id, *, action: str):
        """GET: the form with a fresh request key; POST: keyed (idempotent_form)."""
        require_permission(self.has_change_state_permission(request))
        order_return = get_object_or_404(ReturnRequest, pk=object_id)
        if request.method == "POST":
            submit = _receive_submit if action == "receive" else _retry_submit
            answer = submit(request, order_return)
            if answer is not None:
                return answer
        title = "Mark received" if action == "receive" else "Retry failed steps"
        return TemplateResponse(
            request,
            "admin/orders/returnrequest/action.html",
            {
                **self.admin_site.each_context(request),
                "title": gettext("{action}: return {id}").format(action=title, id=order_return.id),
                "opts": self.model._meta,
                "order_return": order_return,
                "button": title,
                "failed": CompensationStep.objects.filter(
                    order_return=order_return, status=StepStatus.FAILED
                ).count(),
            },
        )


@admin.register(CompensationStep)
class CompensationStepAdmin(DueWorkAdmin):
    """Every compensation step row (due work): "Retry now" is "Retry failed steps" per row."""

    list_display = ["id", "kind", "order", "order_return", "name", "status", "after"]
    list_display = [*list_display, *DueWorkAdmin.due_list_display]
    list_filter = ["kind", "name", "status", *DueWorkAdmin.list_filter]
    list_select_related = ["order", "order_return"]
    search_fields = ["=order__number", "order__owner__email"]
    ordering = ["-id"]

    def retry_one(self, request, pk) -> bool:
        return bool(compensation.steps_retry_failed(step_ids=[pk], by=request.user))


class ReturnInline(ReadOnlyInline):
    model = ReturnRequest
    fields = ["return_link", "status", "refund_amount", "created_at", "steps"]
    readonly_fields = fields
    ordering = ["created_at"]

    @admin.display(description=gettext_lazy("return"))
    def return_link(self, obj):
        url = reverse("admin:orders_returnrequest_change", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.pk)

    @admin.display(description=gettext_lazy("steps"))
    def steps(self, obj):
        return _steps_table(CompensationStep.objects.filter(order_return=obj).order_by("position"))


class CancellationStepInline(ReadOnlyInline):
    model = CompensationStep
    verbose_name_plural = gettext_lazy("cancellation steps")
    fields = ["name", "status", "attempts", "next_attempt_at", "after", "refund_id", "last_error"]
    readonly_fields = fields
    ordering = ["position"]

    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind=CompensationKind.CANCELLATION)


class CancelOrderMixin(admin.ModelAdmin):
    """The orders' admin: the "Cancel order" action and its confirmation page."""

    @admin.action(description=gettext_lazy("Cancel order"), permissions=["change_state"])
    def cancel_order(self, request, queryset):
        ids = list(queryset.values_list("id", flat=True)[:2])
        if len(ids) != 1:
            self.message_user(request, gettext_lazy("Select exactly one order."), level="warning")
            return None
        return HttpResponseRedirect(reverse("admin:orders_order_cancel", args=[ids[0]]))

    def get_urls(self):
        view = self.admin_site.admin_view(self.cancel_view)
        return [
            path("<path:object_id>/cancel-order/", view, name="orders_order_cancel"),
            *super().get_urls(),
        ]

    def cancel_view(self, request, object_id):
        """The confirmation: what cancelling this order does; its form's key names the status."""
        require_permission(request.user.has_perm(permissions.CANCEL))
        order = get_object_or_404(Order.objects.select_related("payment"), pk=object_id)
        if request.method == "POST":
            answer = _cancel_submit(request, order)
            if answer is not None:
                return answer
        return TemplateResponse(
            request,
            "admin/orders/order/cancel.html",
            {
                **self.admin_site.each_context(request),
                "title": gettext("Cancel order {number}").format(number=order.number),
                "opts": self.model._meta,
                "order": order,
                "original": order,
                "explanation": cancel_explanation(order),
                "key": cancel_form_key(order, after=request.GET.get("after", "")),
                "button": gettext("Cancel order"),
            },
        )
