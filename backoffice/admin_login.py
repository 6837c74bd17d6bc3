"""The admin's log-in page, throttled like every other way in (docs/security.md).

`POST /admin/login/` counts in the token endpoint's buckets (per username and
per address, `shop.api.throttles.login_wait`) before the password is checked,
so guessing a staff password through the admin is no cheaper than through
the API or the storefront's form. Everything else is Django's admin log-in.
"""

from __future__ import annotations

import math

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect

from shop.api.throttles import login_wait


@never_cache
@csrf_protect
def admin_login(request: HttpRequest) -> HttpResponse:
    """Refuse a log-in post over the budget with 429 and Retry-After; else the admin's own."""
    if request.method == "POST":
        wait = login_wait(request, username=str(request.POST.get("username", "")))
        if wait is not None:
            seconds = max(1, math.ceil(wait))
            view = LoginView(
                template_name="admin/login.html",
                authentication_form=AdminAuthenticationForm,
                extra_context={
                    **admin.site.each_context(request),
                    "title": gettext("Log in"),
                    "subtitle": None,
                    "app_path": request.get_full_path(),
                    "username": "",
                    "throttled": gettext(
                        "Too many log-in attempts. Try again in {seconds} seconds."
                    ).format(seconds=seconds),
                },
            )
            view.setup(request)
            response = view.render_to_response(
                view.get_context_data(form=AdminAuthenticationForm(request)), status=429
            )
            response["Retry-After"] = str(seconds)
            return response
    return admin.site.login(request)
