"""Keyed confirmations of admin changelist actions ("Requeue", "Refunded outside the shop").

A changelist action that changes state asks first; the confirmation form
carries a request key derived from the action and its rows as shown
(`action_key`), and sending it runs the action once under that key
(idempotency.views.idempotent_form, one phase, a 303 presenter declared
for the completer: `keyed_operation(<name>)(redirect_to_value)` where the
name is defined). Each row's change is still its own conditional
transition, so two different confirmations change each row once.
"""

from __future__ import annotations

import functools
import hashlib

from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.functional import Promise
from django.utils.http import urlencode
from django.utils.translation import gettext

from core.admin import require_permission
from core.errors import ApplicationError

from .keys import Reply, Result, close_run, keyed_operation, keyed_phase
from .views import FORM_FIELD, FORM_REFUSALS, idempotent_form

# The admin's "Needs attention" page (backoffice/needs_attention.py): each of its
# actions is a keyed one-phase form under this operation name. Declared here
# because the page's layer has no app of its own; the completer only forgets
# an abandoned one-phase key, it presents nothing.
ADMIN_NEEDS_ATTENTION = "admin.needs_attention"
IN_USE = "idempotency_key_in_use"


def action_key(operation: str, rows) -> str:
    """The request key of a confirmation form: the action and its rows as they are when shown.

    Not random: two tabs (or two renders) of the same confirmation on the same
    rows in the same state carry the same key, so sending both is one action
    (the second is a replay). The action moves the rows' state (attempts, due
    time, status), so a later confirmation of the same rows gets a new key.
    """
    names = ("attempts", "next_attempt_at", "needs_attention", "done_at", "status", "updated_at")
    parts = [operation]
    for row in sorted(rows, key=lambda row: str(row.pk)):
        parts.append(":".join([str(row.pk), *(str(getattr(row, n, "")) for n in names)]))
    return "admin-action-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def state_key(kind: str, *state) -> str:
    """The request key of an admin form: its kind and the state of what it changes, as shown.

    Not random (as `action_key`): two tabs of the same form on the same state
    carry the same key, so sending both is one change (the second a replay,
    or 422 `idempotency_key_reused` with other values); the change moves the
    state, so the next form gets a new key. A refused submission's key goes
    into `state` (`after`) so the form shown after it carries a fresh one.
    """
    seed = ":".join(str(part) for part in state)
    return f"admin-{kind}-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def refusal_message(request, exc: ApplicationError) -> None:
    """Tell the person a refusal as an admin message: the problem's title, then its detail."""
    text = FORM_REFUSALS.get(exc.code, exc.detail)
    messages.error(request, f"{gettext(exc.default_title())}: {text}")


def admin_form_refusal(request, exc: ApplicationError, *, after: bool = True):
    """`idempotent_form(refusal=...)` for the admin's forms: a message on the page it came from.

    The key refused the submission (reused with other values) or the input
    was refused before anything was stored (400): back to the form's own
    page (GET), whose key is fresh (`after`, see `state_key`). A key still
    running (the second submit of a double click meeting the first) is a
    409 page at the POST's own URL saying so: reloading it sends the same
    POST again, answered with the first one's outcome (docs/admin.md).
    """
    if exc.code == IN_USE:
        response = TemplateResponse(
            request,
            "admin/keyed_in_use.html",
            {
                **admin.site.each_context(request),
                "title": gettext(exc.default_title()),
                "message": FORM_REFUSALS[IN_USE],
            },
            status=exc.status,
        )
        for name, value in exc.headers.items():
            response[name] = value
        return response
    refusal_message(request, exc)
    url = request.path
    if after:
        url = f"{url}?{urlencode({'after': request.POST.get(FORM_FIELD, '')})}"
    return HttpResponseRedirect(url)


@keyed_operation(ADMIN_NEEDS_ATTENTION)
def redirect_to_value(result: Result, *, url: str | None = None, request=None) -> Reply:
    """The keyed confirmations' presenter: 303 to the URL the action decided (its changelist).

    A refusal goes back to `url`, the changelist it came from, with the
    problem's title as a message (the completer's copy, with no request,
    has no page to go back to: the admin index).
    """
    if result.refusal is not None:
        if request is not None:
            refusal_message(request, result.refusal)
        return Reply(status=303, headers={"Location": url or reverse("admin:index")})
    return Reply(status=303, headers={"Location": result.value})


def keyed_action(
    modeladmin,
    request,
    queryset,
    *,
    operation: str,
    title: str | Promise,
    explanation: str | Promise,
    button: str | Promise,
    decide,
    done_message,
):
    """A changelist action that asks first, then runs ONCE per confirmation form.

    Without `confirm=yes`: a confirmation page listing the rows, whose form
    carries a request key (`action_key`). With it: the action runs under that
    key (idempotency.views.idempotent_form, operation `operation`, one phase):
    a double click, a refresh or a second tab of the same confirmation replays
    the first answer (303 to the changelist). `decide(pk)` is each row's own
    conditional transition (True if it changed), so two different
    confirmations still change each row once. `done_message(changed, skipped)`.
    """
    # The changelist offers the action only with its permission
    # (`permissions=["change_state"]`); checked here again so that no other
    # way in (a view calling this) can skip it.
    require_permission(modeladmin.has_change_state_permission(request))
    if request.POST.get("confirm") != "yes":
        rows = list(queryset)
        return TemplateResponse(
            request,
            "admin/keyed_confirm.html",
            {
                **modeladmin.admin_site.each_context(request),
                "title": title,
                "explanation": explanation,
                "button": button,
                "rows": rows,
                "action": request.POST.get("action", ""),
                "request_key": action_key(operation, rows),
                "field": FORM_FIELD,
                "opts": modeladmin.model._meta,
            },
        )
    opts = modeladmin.model._meta
    url = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")

    present = functools.partial(redirect_to_value, url=url, request=request)

    @idempotent_form(
        operation=operation, refusal=functools.partial(admin_form_refusal, after=False)
    )
    def submit(request, *, key):
        run = key.claim()
        with keyed_phase(run, present, next_point="done"):
            pks = list(queryset.values_list("pk", flat=True))
            changed = sum(bool(decide(pk)) for pk in pks)
            messages.success(request, done_message(changed, len(pks) - changed))
            close_run(run, Result.done(url), present)

    return submit(request)
