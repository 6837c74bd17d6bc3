"""Accounts: the account page, sign-up, log-in and log-out, password reset and change.

The account page shows points and purchases and takes an e-mail change, a
"Log out everywhere" or a deletion; log-in is throttled like the token endpoint; password reset and
change are Django's views in the shop's templates.
"""

from __future__ import annotations

import hashlib
import math

from django.contrib import messages
from django.contrib.auth import login as auth_login
from django.contrib.auth import logout as auth_logout
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse, reverse_lazy
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from core.errors import InvalidRequest
from core.money import shop_currency
from core.tokens import password_reset_token_generator

from .. import cart as carts
from .. import history, loyalty, services
from ..api.throttles import login_wait
from ..forms import (
    EmailChangeForm,
    PasswordChangeForm,
    PasswordResetForm,
    SetPasswordForm,
    SignupForm,
)
from .common import refuse_couriers, see_other


def _account_page(request: HttpRequest, *, email_form=None, status=200) -> HttpResponse:
    balance, _version = loyalty.loyalty_get(user=request.user)
    purchases = list(history.history_for_user(user=request.user)[:100])
    context = {
        "balance": balance,
        "purchases": purchases,
        "currency": shop_currency(),
        "email_form": email_form
        # Logged-in pages only; the stubs cannot narrow request.user.
        or EmailChangeForm(user=request.user, initial={"email": request.user.email}),  # type: ignore[union-attr]
    }
    return render(request, "shop/account.html", context, status=status)


@login_required
@require_GET
def account_page(request: HttpRequest) -> HttpResponse:
    return _account_page(request)


@login_required
@require_POST
@refuse_couriers
def account_email(request: HttpRequest) -> HttpResponse:
    """ "Change email" on /account/: the new address and the current password; errors are
    the account page again (400) with them tied to the fields."""
    form = EmailChangeForm(request.POST, user=request.user)
    if not form.is_valid():
        return _account_page(request, email_form=form, status=400)
    # login_required: an authenticated User; the stubs cannot narrow request.user.
    services.user_email_change(user=request.user, email=form.cleaned_data["email"])  # type: ignore[arg-type]
    messages.success(
        request, _("Your e-mail address is now {email}.").format(email=form.cleaned_data["email"])
    )
    return see_other(reverse("account"))


@login_required
@require_POST
@refuse_couriers
def account_delete(request: HttpRequest) -> HttpResponse:
    if request.POST.get("confirm") != "yes":
        messages.error(request, _("Tick the box to confirm that you want to delete your account."))
        return see_other(reverse("account"))
    # login_required: an authenticated User; the stubs cannot narrow request.user.
    services.user_anonymise(user=request.user)  # type: ignore[arg-type]
    auth_logout(request)
    messages.success(
        request, _("Your account was deleted. Your orders stay on record, anonymised.")
    )
    return see_other(reverse("catalog"))


@login_required
@require_POST
def account_logout_everywhere(request: HttpRequest) -> HttpResponse:
    """ "Log out everywhere" on /account/: every API token and every session of the user
    end (docs/storefront.md), this browser's too."""
    # login_required: an authenticated User; the stubs cannot narrow request.user.
    services.user_log_out_everywhere(user=request.user)  # type: ignore[arg-type]
    auth_logout(request)
    messages.success(request, _("You are logged out on every device and every API token ended."))
    return see_other(reverse("login"))


def _safe_next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or reverse("catalog")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return reverse("catalog")


def _merge_guest_cart(request: HttpRequest, user) -> None:
    """Just logged in or signed up: the session's guest cart joins the shopper's (once)."""
    if carts.guest_cart_merge(session=request.session, user=user):
        messages.info(request, _("The items you added before logging in are in your cart."))


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return see_other(reverse("catalog"))
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            user, _token = services.user_register(
                username=data["username"], email=data["email"], password=data["password"]
            )
        except services.UsernameTaken:
            form.add_error("username", _("This username is taken; choose another one."))
        except InvalidRequest as exc:
            for message in (exc.errors or {}).get("password", [exc.detail]):
                form.add_error("password", message)
        else:
            auth_login(request, user, backend="django.contrib.auth.backends.ModelBackend")
            _merge_guest_cart(request, user)
            messages.success(
                request,
                _("Welcome, {username}! Your account is ready.").format(username=user.username),
            )
            return see_other(_safe_next(request))
    status = 400 if form.is_bound and form.errors else 200
    return render(
        request, "shop/signup.html", {"form": form, "next": _safe_next(request)}, status=status
    )


def _throttled(request: HttpRequest, *, username: str) -> str | None:
    """Count a log-in (or reset) attempt in the token endpoint's buckets; the refusal's text."""
    wait = login_wait(request, username=username)
    if wait is None:
        return None
    return str(max(1, math.ceil(wait)))


class ShopLoginView(LoginView):
    template_name = "shop/login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        # Throttled like POST /api/v1/auth/token/, in the same buckets (per
        # username and per address), before the password is even checked.
        seconds = _throttled(request, username=str(request.POST.get("username", "")))
        if seconds is not None:
            response = self.render_to_response(
                self.get_context_data(
                    form=self.get_form_class()(request),
                    throttled=_("Too many log-in attempts. Try again in {seconds} seconds.").format(
                        seconds=seconds
                    ),
                ),
                status=429,
            )
            response["Retry-After"] = seconds
            return response
        return super().post(request, *args, **kwargs)

    def form_valid(self, form):
        response = super().form_valid(form)
        _merge_guest_cart(self.request, form.get_user())
        response.status_code = 303
        return response


@require_http_methods(["GET", "POST"])
def logout_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        auth_logout(request)
        messages.success(request, _("You are logged out."))
        return see_other(reverse("catalog"))
    return render(request, "shop/logout.html")


# --- Password reset and change (Django's views in the shop's templates) --------


class _SeeOther:
    """A form view whose success answers 303 (Post/Redirect/Get), like the shop's forms."""

    def form_valid(self, form):
        response = super().form_valid(form)  # type: ignore[misc]
        if response.status_code == 302:
            response.status_code = 303
        return response


class PasswordResetView(_SeeOther, auth_views.PasswordResetView):
    """`/accounts/password-reset/`: "Email", "Reset password". The same answer whether or not
    the address has an account; throttled in the log-in buckets (per address and per e-mail),
    so the form cannot flood a mailbox."""

    template_name = "shop/password_reset.html"
    form_class = PasswordResetForm
    email_template_name = "shop/email/password_reset.txt"
    html_email_template_name = "shop/email/password_reset.html"
    subject_template_name = "shop/email/password_reset_subject.txt"
    success_url = reverse_lazy("password-reset-done")
    token_generator = password_reset_token_generator  # its age by the database clock

    def post(self, request, *args, **kwargs):
        email = str(request.POST.get("email", ""))[:254].strip().lower()
        # Hashed: an address is no cache key (spaces), and the key need not show it.
        digest = hashlib.sha256(email.encode()).hexdigest()[:32]
        seconds = _throttled(request, username=f"password-reset:{digest}")
        if seconds is not None:
            response = self.render_to_response(
                self.get_context_data(
                    form=self.get_form_class()(request.POST),
                    throttled=_("Too many requests. Try again in {seconds} seconds.").format(
                        seconds=seconds
                    ),
                ),
                status=429,
            )
            response["Retry-After"] = seconds
            return response
        return super().post(request, *args, **kwargs)


class PasswordResetDoneView(auth_views.PasswordResetDoneView):
    template_name = "shop/password_reset_done.html"


class PasswordResetConfirmView(_SeeOther, auth_views.PasswordResetConfirmView):
    """The e-mailed link: "Password", "Confirm password", "Set password" (an invalid or used
    link says so and offers a new one)."""

    template_name = "shop/password_reset_confirm.html"
    form_class = SetPasswordForm
    success_url = reverse_lazy("password-reset-complete")
    token_generator = password_reset_token_generator


class PasswordResetCompleteView(auth_views.PasswordResetCompleteView):
    template_name = "shop/password_reset_complete.html"


class PasswordChangeView(_SeeOther, auth_views.PasswordChangeView):
    """`/accounts/password-change/` (logged in): the session stays logged in afterwards."""

    template_name = "shop/password_change.html"
    form_class = PasswordChangeForm
    success_url = reverse_lazy("password-change-done")


class PasswordChangeDoneView(auth_views.PasswordChangeDoneView):
    template_name = "shop/password_change_done.html"
