"""Every route × every method × every role has its expected answer.

docs/security.md "One permission map".

The test walks Django's URL resolver for every route the project serves and
asks each one, with each method, as each role: anonymous, the shopper who
owns the objects (alice), another shopper (bob), a courier, a view-only staff
user (every "view" permission, nothing else) and full staff (every staff
action's permission, backoffice.permissions, and the views). A route without a
row in ROUTES fails `test_every_route_has_a_row`: a new route must say who
may do what on it. Admin routes are checked as a family (ADMIN_* below): no
one but staff gets past the log-in, a view-only staff user reads every
changelist and is refused every action and custom view that changes something.

Answers: a status, LOGIN (302 to the storefront's or the admin's log-in), or
OK (the request got past every role check: not 401, 403, 404, 405, not the
log-in, not a 5xx; a domain refusal such as 400, 409 or 422 is fine, since
bodies are only valid enough to reach the checks). A method a route does not
list must be refused for every role (401, 403, 405 or the log-in).
Test-only routes (the test settings' probes, views in `tests.`) are skipped.
"""

from __future__ import annotations

import itertools
import re
import uuid
from dataclasses import dataclass, field

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from orders.models import Order
from tests.backoffice.attention_support import captured_payment
from tests.conftest import grant
from tests.orders.shipping import confirm

from .conftest import _hold

pytestmark = pytest.mark.django_db

ROLES = ("anonymous", "shopper", "other", "courier", "viewer", "staff")
OK = "ok"
LOGIN = "login"
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
REFUSED = {401, 403, 405}
PASSWORD = "correct horse battery"
_unique = itertools.count()


def every_route() -> list[tuple[str, object]]:
    """(pattern, callback) for every URL pattern, walking nested resolvers."""

    def walk(resolver, prefix):
        for entry in resolver.url_patterns:
            if isinstance(entry, URLResolver):
                yield from walk(entry, prefix + str(entry.pattern))
            elif isinstance(entry, URLPattern):
                yield prefix + str(entry.pattern), entry

    return list(walk(get_resolver(), ""))


def _view_module(pattern: URLPattern) -> str:
    callback = pattern.callback
    view = getattr(callback, "view_class", None) or getattr(callback, "cls", None) or callback
    return getattr(view, "__module__", "")


def served_routes() -> list[str]:
    """Every production route (test-only views excluded), the admin's included."""
    return [
        route for route, pattern in every_route() if not _view_module(pattern).startswith("tests.")
    ]


# --- The table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One route: per method, the answer to each role (in ROLES order)."""

    answers: dict[str, tuple]
    # Path parameters: a World attribute name or a literal.
    args: dict[str, str] = field(default_factory=dict)
    # Per method: the body (a callable gets the role) and whether it is keyed (API).
    bodies: dict[str, object] = field(default_factory=dict)
    # Every request gets a fresh user of its role (the request ends the account or
    # the session: account deletion, log-out).
    fresh: bool = False


def _order_body(role):
    return {
        "lines": [{"sku": "MUG", "quantity": 3}],
        "on_shortage": "ask",
        "payment_method": "pm_card_ok",
        "shipping_address": {
            "name": "R",
            "line1": "1 Road",
            "city": "X",
            "postal_code": "1",
            "country": "GB",
        },
    }


def _register_body(role):
    name = f"reg{next(_unique)}"
    return {"username": name, "email": f"{name}@example.com", "password": "a long pass phrase 1"}


def _product_body(role):
    return {
        "sku": f"NEW-{next(_unique)}",
        "name": "New",
        "price": "1.00",
        "currency": "EUR",
        "stock": 1,
    }


EVERYONE_OK = (OK,) * 6
SIGNED_IN = (401, OK, OK, OK, OK, OK)
NOT_COURIER = (401, OK, OK, 403, OK, OK)
OWNER_OR_STAFF_READ = (401, OK, 404, 403, OK, OK)
STAFF_ACTION = (401, 403, 403, 403, 403, OK)
PAGE_EVERYONE = (200,) * 6
PAGE_SIGNED_IN = (LOGIN, 200, 200, 200, 200, 200)
# A storefront page that changes something: a courier gets the 403 page.
CHANGE_NOT_COURIER = (OK, OK, OK, 403, OK, OK)
CHANGE_SIGNED_IN_NOT_COURIER = (LOGIN, OK, OK, 403, OK, OK)
# The storefront shows everyone their own orders only: staff included.
OWN_ORDER_PAGE = (LOGIN, 200, 404, 404, 404, 404)
OWN_ORDER_CHANGE = (LOGIN, OK, 404, 403, 404, 404)
SIGNED_IN_OK = (LOGIN, OK, OK, OK, OK, OK)
SIGNED_IN_SENT_ON = (405, OK, OK, OK, OK, OK)

ROUTES: dict[str, Row] = {
    # --- Operations ---
    # Probes answer any method the same and change nothing.
    "livez": Row(dict.fromkeys(METHODS, PAGE_EVERYONE)),
    "healthz": Row(dict.fromkeys(METHODS, EVERYONE_OK)),
    # The test client calls from loopback, which may read the metrics.
    "metrics": Row({"GET": PAGE_EVERYONE}),
    "api/schema/": Row({"GET": PAGE_EVERYONE}),
    "api/docs/": Row({"GET": PAGE_EVERYONE}),
    # --- API: accounts ---
    "api/v1/auth/register/": Row({"POST": EVERYONE_OK}, bodies={"POST": _register_body}),
    "api/v1/auth/token/": Row(
        {"POST": (200,) * 6}, bodies={"POST": {"username": "tokenuser", "password": PASSWORD}}
    ),
    "api/v1/auth/account/": Row({"DELETE": NOT_COURIER}, fresh=True),
    "api/v1/loyalty/": Row({"GET": SIGNED_IN}),
    "api/v1/purchase-history/": Row({"GET": SIGNED_IN}),
    # --- API: catalogue ---
    "api/v1/products/": Row(
        {"GET": PAGE_EVERYONE, "POST": STAFF_ACTION}, bodies={"POST": _product_body}
    ),
    "api/v1/products/<str:sku>/": Row({"GET": PAGE_EVERYONE}),
    "api/v1/products/<str:sku>/stock/": Row({"POST": STAFF_ACTION}, bodies={"POST": {"delta": 1}}),
    # --- API: orders ---
    "api/v1/orders/": Row({"GET": NOT_COURIER, "POST": NOT_COURIER}, bodies={"POST": _order_body}),
    "api/v1/orders/<str:order_id>/": Row({"GET": OWNER_OR_STAFF_READ}),
    # Confirming charges the shopper's card: theirs alone, not staff's.
    "api/v1/orders/<str:order_id>/confirm/": Row(
        {"POST": (401, OK, 404, 403, 403, 403)}, args={"order_id": "asked"}, bodies={"POST": None}
    ),
    # The owner cancels their own; staff need orders.change_order for someone else's.
    "api/v1/orders/<str:order_id>/cancel/": Row(
        {"POST": (401, OK, 404, 403, 403, OK)}, args={"order_id": "paid"}, bodies={"POST": None}
    ),
    "api/v1/orders/<str:order_id>/shipments/": Row(
        {"POST": STAFF_ACTION}, args={"order_id": "paid"}, bodies={"POST": {}}
    ),
    "api/v1/shipments/<str:shipment_id>/tracking-events/": Row(
        {"GET": OWNER_OR_STAFF_READ, "POST": (401, 403, 403, 202, 403, 202)},
        bodies={
            "POST": {
                "event_id": "ev-route",
                "status": "in_transit",
                "occurred_at": "2026-05-01T10:00:00Z",
            }
        },
    ),
    "api/v1/orders/<str:order_id>/refunds/": Row(
        {"GET": OWNER_OR_STAFF_READ, "POST": STAFF_ACTION},
        bodies={"POST": {"amount": "1.00", "currency": "EUR", "reason": "goodwill"}},
    ),
    # The owner asks; staff need orders.add_returnrequest on someone else's order.
    "api/v1/orders/<str:order_id>/returns/": Row(
        {"POST": (401, OK, 404, 403, 403, OK)},
        bodies={"POST": {"lines": [{"sku": "TEE-M", "quantity": 1}], "reason": "r"}},
    ),
    "api/v1/returns/<str:return_id>/": Row({"GET": OWNER_OR_STAFF_READ}),
    "api/v1/returns/<str:return_id>/receive/": Row({"POST": STAFF_ACTION}, bodies={"POST": None}),
    # Signed by the provider, not by a role: unsigned is 400 for everyone.
    "api/v1/payments/webhooks/": Row({"POST": (400,) * 6}, bodies={"POST": {}}),
    # Reading reports needs reports.view_dailysalesreport (the viewer holds every view).
    "api/v1/reports/daily-sales/": Row({"GET": (401, 403, 403, 403, 200, 200)}),
    # --- Storefront ---
    "": Row({"GET": PAGE_EVERYONE}),
    "products/<str:sku>/": Row(
        {"GET": PAGE_EVERYONE, "POST": CHANGE_NOT_COURIER},
        bodies={"POST": {"quantity": "1", "cart_version": "0"}},
    ),
    "cart/": Row(
        {"GET": PAGE_EVERYONE, "POST": CHANGE_NOT_COURIER},
        bodies={"POST": {"cart_version": "0", "sku": "TEE-M", "action": "remove"}},
    ),
    # A key of no cart: refused as "cart changed" after the role checks.
    "checkout/": Row(
        {"GET": SIGNED_IN_OK, "POST": CHANGE_SIGNED_IN_NOT_COURIER},
        bodies={"POST": {"idempotency_key": "checkout:0:0"}},
    ),
    "orders/": Row({"GET": PAGE_SIGNED_IN}),
    "orders/<str:order_id>/": Row({"GET": OWN_ORDER_PAGE}),
    "orders/<str:order_id>/status/": Row({"GET": OWN_ORDER_PAGE}),
    # No key: the keyed form refuses it (400) after the role checks; nothing charged.
    "orders/<str:order_id>/confirm/": Row(
        {"POST": OWN_ORDER_CHANGE}, args={"order_id": "asked"}, bodies={"POST": {}}
    ),
    "orders/<str:order_id>/cancel/": Row(
        {"POST": OWN_ORDER_CHANGE}, args={"order_id": "paid"}, bodies={"POST": {}}
    ),
    "orders/<str:order_id>/return/": Row(
        {"GET": OWN_ORDER_PAGE, "POST": OWN_ORDER_CHANGE}, bodies={"POST": {}}
    ),
    "account/": Row({"GET": PAGE_SIGNED_IN}),
    # Invalid forms (no password, no confirmation): nothing changes for anyone let in.
    "account/email/": Row({"POST": CHANGE_SIGNED_IN_NOT_COURIER}, bodies={"POST": {}}),
    "account/delete/": Row({"POST": CHANGE_SIGNED_IN_NOT_COURIER}, bodies={"POST": {}}),
    # Ends the user's own tokens and sessions: the account's own credentials, as log-out.
    "account/logout-everywhere/": Row({"POST": SIGNED_IN_OK}, bodies={"POST": {}}, fresh=True),
    # The account's own credentials: open to couriers as to anyone.
    "accounts/signup/": Row(
        {"GET": EVERYONE_OK, "POST": EVERYONE_OK}, bodies={"POST": {}}, fresh=True
    ),
    # Django's form views take PUT as POST; a signed-in user is sent on from the log-in
    # page (302, not to the log-in) whatever the method.
    "accounts/login/": Row(
        {
            "GET": EVERYONE_OK,
            "POST": EVERYONE_OK,
            "PUT": EVERYONE_OK,
            "PATCH": SIGNED_IN_SENT_ON,
            "DELETE": SIGNED_IN_SENT_ON,
        },
        bodies={"POST": {}},
        fresh=True,
    ),
    "accounts/logout/": Row({"GET": EVERYONE_OK, "POST": EVERYONE_OK}, fresh=True),
    # The language switcher (Django's set_language): anyone may choose a language.
    "i18n/setlang/": Row({"POST": EVERYONE_OK}, bodies={"POST": {"language": "fr"}}),
    "accounts/password-reset/": Row(
        {"GET": PAGE_EVERYONE, "POST": EVERYONE_OK, "PUT": EVERYONE_OK},
        bodies={"POST": {"email": "x@example.com"}},
    ),
    "accounts/password-reset/done/": Row({"GET": PAGE_EVERYONE}),
    "accounts/password-reset/complete/": Row({"GET": PAGE_EVERYONE}),
    # A link that is not valid: the same page whatever the method, nothing set.
    "accounts/password-reset/<uidb64>/<token>/": Row(
        dict.fromkeys(METHODS, EVERYONE_OK),
        args={"uidb64": "MA", "token": "set-password"},
        bodies={"POST": {}},
    ),
    "accounts/password-change/": Row(
        {"GET": PAGE_SIGNED_IN, "POST": SIGNED_IN_OK, "PUT": SIGNED_IN_OK}, bodies={"POST": {}}
    ),
    "accounts/password-change/done/": Row({"GET": PAGE_SIGNED_IN}),
}

# Path parameters no row names: these objects.
DEFAULT_ARGS = {
    "order_id": "shipped",
    "shipment_id": "shipment",
    "return_id": "order_return",
    "sku": "TEE-M",
}


def is_admin(route: str) -> bool:
    return route.startswith("admin/")


def test_every_route_has_a_row():
    """A new route fails here until ROUTES (or the admin family) says who may do what."""
    missing = [r for r in served_routes() if not is_admin(r) and r not in ROUTES]
    assert not missing, f"routes without a row in ROUTES: {missing}"
    stale = sorted(set(ROUTES) - set(served_routes()))
    assert not stale, f"rows of routes that no longer exist: {stale}"
    for route, row in ROUTES.items():
        for method, answers in row.answers.items():
            assert method in METHODS and len(answers) == len(ROLES), (route, method)


# --- The world the table is asked in -------------------------------------------------------


@dataclass
class Roles:
    users: dict
    world: object
    paid: Order
    api: dict = field(default_factory=dict)
    browsers: dict = field(default_factory=dict)


def _view_permissions() -> list[str]:
    rows = Permission.objects.filter(codename__startswith="view_")
    return [
        f"{app}.{code}" for app, code in rows.values_list("content_type__app_label", "codename")
    ]


def _make_role(role: str, make_user, world):
    if role == "shopper":
        return world.alice
    if role == "other":
        return world.bob
    if role == "courier":
        return make_user(courier=True)
    if role == "viewer":
        user = make_user(staff=True)
        grant(user, *_view_permissions())
        return user
    if role == "staff":
        user = make_user(actions=True)
        grant(user, *_view_permissions())
        return user
    return None


@pytest.fixture
def roles(world, make_user, client_for) -> Roles:
    make_user(username="tokenuser")
    # Decided already: the owner's confirm gets past the role checks to 409, and no
    # request calls the payment provider (the test runs in one transaction).
    Order.objects.filter(pk=world.asked.pk).update(status="cancelled")
    Order.objects.filter(pk=world.shipped.pk).update(payment=captured_payment("20.00"))
    paid = confirm(_hold(world.alice, {"TEE-M": 1}))
    Order.objects.filter(pk=paid.pk).update(payment=captured_payment("10.00"))
    users = {role: _make_role(role, make_user, world) for role in ROLES}
    found = Roles(users=users, world=world, paid=paid)
    for role, user in users.items():
        found.api[role] = client_for(user) if user else APIClient()
        found.browsers[role] = _browser(user)
    found.make_user = make_user  # type: ignore[attr-defined]
    found.client_for = client_for  # type: ignore[attr-defined]
    return found


def _browser(user) -> Client:
    browser = Client()
    if user is not None:
        browser.force_login(user)
    return browser


def _path(route: str, row: Row, roles: Roles) -> str:
    args = {**DEFAULT_ARGS, **row.args}

    def value(name: str) -> str:
        wanted = args[name]
        if wanted == "paid":
            return str(roles.paid.id)
        found = getattr(roles.world, wanted, None)
        return str(found.id) if found is not None else wanted

    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: value(m[1]), route)


def _client(route: str, row: Row, role: str, roles: Roles):
    api = route.startswith("api/")
    if role == "anonymous":
        return APIClient() if api else Client()
    if not row.fresh:
        return roles.api[role] if api else roles.browsers[role]
    user = _make_role(role, roles.make_user, roles.world)  # type: ignore[attr-defined]
    if role in ("shopper", "other"):
        user = roles.make_user()  # type: ignore[attr-defined]
    return roles.client_for(user) if api else _browser(user)  # type: ignore[attr-defined]


def _ask(client, method: str, path: str, body, *, api: bool):
    cache.clear()  # throttles answer 429 to a table, not to a person
    extra = {"HTTP_IDEMPOTENCY_KEY": f"route-{uuid.uuid4().hex}"} if api else {}
    call = getattr(client, method.lower())
    if api:
        if body is None:
            return call(path, **extra)
        return call(path, body, format="json", **extra)
    return call(path, body or {}) if method == "POST" else call(path)


def _matches(response, expected, *, admin: bool = False) -> bool:
    status = response.status_code
    login = status == 302 and (
        "/admin/login/" in response["Location"]
        if admin
        else response["Location"].startswith("/accounts/login/")
    )
    if expected == LOGIN:
        return login
    if expected == OK:
        return status < 500 and status not in (401, 403, 404, 405) and not login
    return status == expected


def test_every_route_answers_every_role_as_its_row_says(roles):
    wrong = []
    for route in served_routes():
        if is_admin(route):
            continue
        row = ROUTES[route]
        path = _path(route, row, roles)
        for method in METHODS:
            for index, role in enumerate(ROLES):
                client = _client(route, row, role, roles)
                body = row.bodies.get(method)
                body = body(role) if callable(body) else body
                response = _ask(client, method, path, body, api=route.startswith("api/"))
                if method in row.answers:
                    expected = row.answers[method][index]
                    if not _matches(response, expected):
                        wrong.append((method, path, role, expected, response.status_code))
                elif not (response.status_code in REFUSED or _matches(response, LOGIN)):
                    wrong.append((method, path, role, "refused", response.status_code))
    assert not wrong, "\n".join(map(str, wrong))


# --- The admin, as a family ---------------------------------------------------------------

# The admin's own views beyond Django's (add, change, delete, history, changelist):
# what a view-only staff user gets from GET and POST, and whether full staff may open it.
ADMIN_CUSTOM: dict[str, tuple[int, int, int]] = {
    "orders_order_ship": (403, 403, 200),
    "orders_order_cancel": (403, 403, 200),
    "orders_order_refund": (403, 403, 200),
    "orders_returnrequest_receive": (403, 403, 200),
    "orders_returnrequest_retry": (403, 403, 200),
    "inventory_stockitem_adjust": (403, 403, 200),
    # Exports only read: a viewer downloads what the changelist shows (any method).
    "orders_order_export": (200, 200, 200),
    "payments_refund_export": (200, 200, 200),
    "reports_dailysalesreport_export": (200, 200, 200),
}
ADMIN_STANDARD = re.compile(r"_(changelist|add|change|delete|history)$")
ADMIN_SITE = {
    "admin-login",
    "admin-index",
    "admin-needs-attention",
    "index",
    "login",
    "logout",
    "password_change",
    "password_change_done",
    "autocomplete",
    "jsi18n",
    "view_on_site",
    "app_list",
    None,  # the object's bare path (a redirect to its change page) and the catch-all
}


def admin_patterns() -> list[tuple[str, URLPattern]]:
    return [
        (route, pattern)
        for route, pattern in every_route()
        if is_admin(route) and not _view_module(pattern).startswith("tests.")
    ]


def test_every_admin_route_belongs_to_the_family():
    """A new custom admin view fails here until ADMIN_CUSTOM says who may open it."""
    strays = [
        (route, p.name)
        for route, p in admin_patterns()
        if p.name not in ADMIN_SITE
        and p.name not in ADMIN_CUSTOM
        and not ADMIN_STANDARD.search(p.name or "")
    ]
    assert not strays, f"admin routes outside the family: {strays}"


def _admin_path(route: str, objects: dict[str, str]) -> str:
    def value(match) -> str:
        name = match[1]
        if name == "object_id":
            return objects.get(route.split("/")[2], "0")
        return {"content_type_id": "1", "id": "1", "app_label": "orders", "url": "x/"}.get(
            name, "0"
        )

    route = route.replace("^(?P<app_label>", "<app_label>").replace("(?P<url>.*)$", "<url>")
    route = re.sub(r"<app_label>[^/]*\)/\$", "<app_label>/", route)
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", value, route)


def test_no_one_but_staff_passes_the_admin_log_in(roles):
    """Anonymous (GET and POST), a shopper and a courier (GET): every admin route is the
    log-in (one gate, `admin_view`, for every route: the signed-in non-staff roles share
    it, so they ask with GET only)."""
    wrong = []
    for route, pattern in admin_patterns():
        if pattern.name in ("admin-login", "login"):
            continue
        path = _admin_path(route, {})
        for role, method in (
            ("anonymous", "GET"),
            ("anonymous", "POST"),
            ("shopper", "GET"),
            ("courier", "GET"),
        ):
            client = Client() if role == "anonymous" else roles.browsers[role]
            response = getattr(client, method.lower())(path)
            if pattern.name == "logout":  # sent to the admin's index, which is the log-in
                refused = response.status_code == 302 and response["Location"] == "/admin/"
            else:
                refused = _matches(response, LOGIN, admin=True)
            if not refused:
                wrong.append((method, path, role, response.status_code))
    assert not wrong, "\n".join(map(str, wrong))


def test_a_view_only_staff_user_reads_the_admin_and_changes_nothing(roles):
    """Every changelist opens; every action posted there and every custom view is refused."""
    from django.contrib import admin as django_admin

    world = roles.world
    objects = {
        "order": str(roles.paid.pk),
        "returnrequest": str(world.order_return.pk),
        "stockitem": str(_stock_pk()),
        "shipment": str(world.shipment.pk),
    }
    viewer, staff = roles.browsers["viewer"], roles.browsers["staff"]
    before = _admin_state()
    wrong = []
    for route, pattern in admin_patterns():
        path = _admin_path(route, objects)
        name = pattern.name or ""
        if name.endswith("_changelist"):
            if viewer.get(path).status_code != 200:
                wrong.append(("GET", path, viewer.get(path).status_code))
        if name in ADMIN_CUSTOM:
            get, post, staff_get = ADMIN_CUSTOM[name]
            answers = (viewer.get(path), viewer.post(path, {"idempotency_key": "k"}))
            pairs = zip(("GET", "POST"), (get, post), answers, strict=True)
            for method, expected, response in pairs:
                if response.status_code != expected:
                    wrong.append((method, path, "viewer", expected, response.status_code))
            if staff.get(path).status_code != staff_get:
                wrong.append(("GET", path, "staff", staff_get, staff.get(path).status_code))
    # Every action of every model admin, forced by POST with one row selected.
    for model, model_admin in django_admin.site._registry.items():
        if model._meta.app_label == "testsupport":
            continue
        declared = [a if isinstance(a, str) else a.__name__ for a in model_admin.actions or ()]
        changelist = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        row = model.objects.order_by("pk").values_list("pk", flat=True).first() or 0
        for action in [*declared, "delete_selected"]:
            response = viewer.post(changelist, {"action": action, "_selected_action": [row]})
            if response.status_code not in (403, 302, 200):
                wrong.append(("POST", changelist, action, response.status_code))
    assert not wrong, "\n".join(map(str, wrong))
    assert _admin_state() == before


def _stock_pk():
    from inventory.models import StockItem

    return StockItem.objects.get(product__sku="TEE-M").pk


def _admin_state() -> tuple:
    from django.apps import apps

    from inventory.models import StockItem
    from orders.models import ReturnRequest

    counts = {
        model._meta.label: model.objects.count()
        for model in apps.get_models()
        if model._meta.app_label in ("orders", "inventory", "payments", "reports", "shop", "auth")
    }
    return (
        counts,
        sorted(Order.objects.values_list("id", "status", "fulfillment")),
        sorted(ReturnRequest.objects.values_list("id", "status")),
        sorted(StockItem.objects.values_list("id", "on_hand", "reserved")),
    )
