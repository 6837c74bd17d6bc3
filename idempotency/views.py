"""View glue for request keys: a DRF method decorator and a plain-Django form equivalent.

DRF (the header `Idempotency-Key`):

    class ThingView(APIView):
        @idempotent(operation="thing.create")
        def post(self, request, *, key: KeyRequest):
            data = ThingIn(data=request.data)
            data.is_valid(raise_exception=True)          # 400 before the claim
            things.operations.thing_create_keyed(
                run=key.claim(), present=presenters.thing_created, **data.validated_data
            )

The order of checks is the contract's: DRF authenticates first (401), the
decorator checks the header (400), the view validates the body (400, nothing
claimed), `key.claim()` claims or matches the key (replay / 409 / 422), then
the domain decides a result and the view's presenter makes it the answer
(idempotency.keys.operations: `run.finish()` / `run.leave_open()` underneath).
The decorator answers from what the run stored, so the first answer and every
replay are the same bytes; a replay carries `Idempotent-Replayed: true`.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.translation import gettext_lazy
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotAuthenticated

from core.errors import ApplicationError
from core.logging import bind as log_bind
from core.logging import key_hash

from .keys import (
    JSON_CONTENT_TYPE,
    Answer,
    KeyLeaseLost,
    KeyRun,
    Reply,
    body_fingerprint,
    key_answer_existing,
    key_claim,
    key_lookup,
    key_run_failed,
    key_stored_answer,
    key_validate,
)
from .models import FINISHED

IDEMPOTENCY_HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
FORM_FIELD = "idempotency_key"

IDEMPOTENCY_KEY_PARAMETER = OpenApiParameter(
    name=IDEMPOTENCY_HEADER,
    type=OpenApiTypes.STR,
    location=OpenApiParameter.HEADER,
    required=True,
    description=(
        "Client-chosen key (1-255 visible ASCII characters) making this request safe to "
        "retry: the first answer is stored and replayed with `Idempotent-Replayed: true`."
    ),
)


class _Replay(Exception):
    def __init__(self, answer: Answer) -> None:
        super().__init__("replay")
        self.answer = answer


class KeyRequest:
    """A keyed request before its claim; the view calls `claim()` once the body is valid."""

    def __init__(
        self,
        *,
        owner_id: int,
        key: str,
        operation: str,
        method: str,
        path: str,
        body: Callable[[], Any],
    ) -> None:
        self.owner_id = owner_id
        self.key = key
        log_bind(idempotency_key_hash=key_hash(key))  # logs carry the hash, never the key
        self.operation = operation
        self.method = method
        self.path = path
        self._body = body
        self._row: Any = None
        self._looked_up = False
        self.fingerprint: str | None = None
        self.run: KeyRun | None = None

    @property
    def scope(self) -> str:
        """The business scope a form's key names: its owner and the key, as the key row has them.

        A form's effect keeps it on the row it creates, under a unique
        constraint, so the form acts once for that row's whole life, also
        after the key row is purged (docs/idempotency.md, "Business scopes
        that outlive request keys").
        """
        return f"{self.owner_id}:{self.key}"

    def stored_answer(self) -> Answer | None:
        """Read the key once; return its stored answer if this same request finished before.

        A finished key made by an identical request is answered before the
        view runs: its body validated the first time, and the contract
        promises the stored answer. Anything else goes through the view
        (validation first, then claim(), which reuses this read).
        """
        self._row = key_lookup(owner_id=self.owner_id, key=self.key)
        self._looked_up = True
        if self._row is None or self._row.recovery_point != FINISHED:
            return None
        self.fingerprint = body_fingerprint(self._body())
        return key_stored_answer(
            row=self._row, method=self.method, path=self.path, fingerprint=self.fingerprint
        )

    def claim(self) -> KeyRun:
        """Claim the key and return the run handle; a replay or refusal leaves the view here."""
        if self.run is not None:
            raise RuntimeError("the key is already claimed")
        if self.fingerprint is None:
            self.fingerprint = body_fingerprint(self._body())
        extra = {"row": self._row} if self._looked_up else {}
        self._looked_up = False
        result = key_claim(
            owner_id=self.owner_id,
            key=self.key,
            operation=self.operation,
            method=self.method,
            path=self.path,
            fingerprint=self.fingerprint,
            **extra,
        )
        if isinstance(result, Answer):
            raise _Replay(result)
        self.run = result
        return result

    def answer_existing(self) -> Answer:
        """Answer from the key's row after this request lost its claim or lock."""
        assert self.fingerprint is not None
        return key_answer_existing(
            owner_id=self.owner_id,
            key=self.key,
            operation=self.operation,
            method=self.method,
            path=self.path,
            fingerprint=self.fingerprint,
        )


def answer_response(answer: Answer, *, replayed: bool) -> HttpResponse:
    """Build the HTTP response for a stored or fresh answer."""
    response = HttpResponse(
        b"" if answer.body is None else answer.body.encode(),
        status=answer.status,
        content_type=answer.headers.get("Content-Type"),
    )
    for name, value in answer.headers.items():
        if name.lower() != "content-type":
            response[name] = value
    if replayed:
        response[REPLAYED_HEADER] = "true"
    return response


def run_keyed(handle: KeyRequest, call: Callable[[], Any]) -> Any:
    """Replay a finished identical request, or call the keyed view and answer its outcome."""
    stored = handle.stored_answer()
    if stored is not None:
        return answer_response(stored, replayed=True)
    try:
        result = call()
    except _Replay as replay:
        return answer_response(replay.answer, replayed=True)
    except KeyLeaseLost:
        # Another request inserted the key first, or a retry took it over while
        # this one stalled: this request committed nothing more. Answer what
        # the key holds now (422 if it is another request, 409 while it runs).
        return answer_response(handle.answer_existing(), replayed=True)
    except BaseException as exc:
        run = handle.run
        if run is None:
            raise
        try:
            stored = key_run_failed(run=run, exc=exc)
        except KeyLeaseLost:
            return answer_response(handle.answer_existing(), replayed=True)
        if stored is None:
            raise
        return answer_response(stored, replayed=False)
    run = handle.run
    if run is None:
        return result  # answered before claiming (e.g. a re-rendered form)
    if run.answer is None:
        run.drop_lease_quietly()
        raise RuntimeError(f"{run!r} returned without finish() or leave_open()")
    return answer_response(run.answer, replayed=False)


def idempotent(*, operation: str) -> Callable:
    """Make a DRF APIView method keyed by the `Idempotency-Key` header.

    The method gets `key: KeyRequest` and must call `key.claim()` after
    validating the body; the operation then ends with `run.finish()` or
    `run.leave_open()` (or a stored ApplicationError, see keys.key_run_failed).
    """

    def decorator(method: Callable) -> Callable:
        @functools.wraps(method)
        def wrapper(view, request, *args, **kwargs):
            if not request.user or not request.user.is_authenticated:
                raise NotAuthenticated()
            key = key_validate(request.headers.get(IDEMPOTENCY_HEADER))
            handle = KeyRequest(
                owner_id=request.user.pk,
                key=key,
                operation=operation,
                method=request.method,
                path=request.path,
                body=lambda: request.data,
            )
            return run_keyed(handle, lambda: method(view, request, *args, key=handle, **kwargs))

        wrapper.idempotent_operation = operation  # type: ignore[attr-defined]
        return extend_schema(parameters=[IDEMPOTENCY_KEY_PARAMETER])(wrapper)

    return decorator


# --- Plain Django form views --------------------------------------------------


def form_fields(post: Any, *, exclude: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """Return the submitted form fields as {name: [values]} without the excluded ones."""
    return {name: post.getlist(name) for name in post if name not in exclude}


# What a person is told when a form's key refuses the submission (the admin's
# forms say it as a message, idempotency.admin_actions.admin_form_refusal).
FORM_REFUSALS: dict[str, str | Promise] = {
    "idempotency_key_in_use": gettext_lazy(
        "This form is being submitted already. Wait a moment, then "
        "reload the page to see the result."
    ),
    "idempotency_key_reused": gettext_lazy(
        "This form was already submitted with other values. Open the "
        "form again to start a new submission."
    ),
}


def form_refusal(
    request: HttpRequest,
    exc: ApplicationError,
    *,
    texts: Mapping[str, str | Promise] = FORM_REFUSALS,
    template: str | None = None,
) -> HttpResponse:
    """Render a refusal of a keyed form submission as a page, with the refusal's headers.

    `texts` says each refusal code in the site's own words (else the error's
    detail); `template` renders it in the site's page (context: `message`,
    `title`), else a small bare HTML page. A site binds both with
    `functools.partial` and passes that as `idempotent_form(refusal=...)`.
    """
    text = texts.get(exc.code, exc.detail)
    title = exc.default_title()
    if template is None:
        response = HttpResponse(
            format_html("<!doctype html><title>{}</title><p>{}</p>", title, text),
            status=exc.status,
        )
    else:
        response = render(request, template, {"message": text, "title": title}, status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def idempotent_form(
    *,
    operation: str,
    field: str = FORM_FIELD,
    refusal: Callable[[HttpRequest, ApplicationError], HttpResponse] = form_refusal,
) -> Callable:
    """Make a plain Django view's POST keyed by a hidden form field (see form_key_field).

    The view gets `key: KeyRequest` on POST (None otherwise), validates its
    form (re-rendering it claims nothing), then calls `key.claim()` and runs
    the keyed operation with a presenter answering
    `Reply(status=303, headers={"Location": url})` (idempotency.keys),
    under an operation name of its own so the completer redirects too.
    The fingerprint covers every posted field except the key and the CSRF token.
    """

    def decorator(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            if request.method != "POST":
                return view(request, *args, key=None, **kwargs)
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            try:
                key = key_validate(request.POST.get(field))
                handle = KeyRequest(
                    owner_id=request.user.pk,
                    key=key,
                    operation=operation,
                    method=request.method,
                    path=request.path,
                    body=lambda: form_fields(request.POST, exclude=(field, "csrfmiddlewaretoken")),
                )
                response = run_keyed(handle, lambda: view(request, *args, key=handle, **kwargs))
            except ApplicationError as exc:
                return refusal(request, exc)
            return form_message_shown(request, response)

        return wrapper

    return decorator


FORM_MESSAGE_LEVELS = {"success": messages.SUCCESS, "error": messages.ERROR}


def form_redirect(url: str, *, message: str = "", level: str = "success") -> Reply:
    """A keyed form's 303 answer to `url`, with its message stored in the answer.

    The message (`level`: "success" or "error") is part of what the key
    stores, so every answer to the key shows it: a double click whose first
    answer the browser dropped (it follows the second submit, a replay)
    still tells the person what happened. `idempotent_form` turns it into a
    Django message on the request that gets the answer.
    """
    body = {"message": message, "level": level} if message else None
    return Reply(status=303, headers={"Location": url}, body=body)


def form_message_shown(request: HttpRequest, response: Any) -> Any:
    """Show the message a `form_redirect` answer carries, and send the 303 without a body."""
    if (
        isinstance(response, HttpResponse)
        and response.status_code == 303
        and response.content
        and response.get("Content-Type", "").startswith(JSON_CONTENT_TYPE)
    ):
        data = json.loads(response.content)
        level = FORM_MESSAGE_LEVELS.get(data.get("level"), messages.SUCCESS)
        messages.add_message(request, level, str(data.get("message", "")))
        response.content = b""
        del response["Content-Type"]
    return response


def form_key_new() -> str:
    """Return a fresh key for a rendered form."""
    return uuid.uuid4().hex


def form_key_field(field: str = FORM_FIELD) -> str:
    """Return the hidden input carrying a fresh key, for a form template."""
    return format_html('<input type="hidden" name="{}" value="{}">', field, form_key_new())
