"""The admin's own names in French: app, model and field names, an order's title, and
the refusals `orders.services` and `orders.operations` raise; the API's answer stays
English (docs/storefront.md, "Languages")."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client
from django.urls import reverse

from orders.models import Order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def staff(make_user):
    user = make_user(staff=True, username="boss")
    user.is_superuser = True
    user.save()
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def pending_order(make_product, reserve) -> Order:
    """An order whose payment's outcome is not known: cancelling it is refused."""
    make_product("TEE-M", price="10.00", stock=10)
    return reserve({"TEE-M": 2})


def _page(client, url: str) -> str:
    answer = client.get(url)
    assert answer.status_code == 200
    return answer.content.decode()


def test_the_order_pages_name_the_app_the_model_and_the_fields_in_french(staff, pending_order):
    staff.cookies.load({settings.LANGUAGE_COOKIE_NAME: "fr"})
    listing = _page(staff, reverse("admin:orders_order_changelist"))
    assert "Commandes" in listing  # the app's name (breadcrumb) and the model's plural
    assert "Numéro" in listing and "Expédition" in listing  # column headers: field names
    assert f"commande {pending_order.number} (payment_pending)" in listing  # a checkbox label
    change = _page(staff, reverse("admin:orders_order_change", args=[pending_order.pk]))
    assert f"commande {pending_order.number} (payment_pending)" in change  # Order.__str__
    assert "Moyen de paiement" in change and "Adresse de livraison" in change  # field labels
    assert "Prix unitaire" in change and "Quantité demandée" in change  # the lines' labels
    assert "Payment method" not in change and "Shipping address" not in change
    index = _page(staff, reverse("admin:index"))
    assert "Paiements" in index and "Catalogue et stock" in index  # apps' names
    assert "Règlements de paiement" in index and "Lettres mortes" in index  # models' names

    # In English every name is the one Django derives from the code, as before.
    staff.cookies.load({settings.LANGUAGE_COOKIE_NAME: "en"})
    change = _page(staff, reverse("admin:orders_order_change", args=[pending_order.pk]))
    assert f"order {pending_order.number} (payment_pending)" in change
    assert "Payment method" in change and "Shipping address" in change
    index = _page(staff, reverse("admin:index"))
    assert "Payment settlements" in index and "Catalog and stock" in index


def test_a_refused_cancel_reads_in_french_in_the_admin_and_in_english_in_the_api(
    staff, pending_order, shopper_client
):
    staff.cookies.load({settings.LANGUAGE_COOKIE_NAME: "fr"})
    url = reverse("admin:orders_order_cancel", args=[pending_order.pk])
    form = staff.get(url).content.decode()
    key = form.split('name="idempotency_key" value="', 1)[1].split('"', 1)[0]
    refused = staff.post(url, {"idempotency_key": key})
    assert refused.status_code == 303
    page = _page(staff, refused["Location"])
    assert "L&#x27;issue du paiement n&#x27;est pas encore connue ; annulez une fois" in page
    assert "cancel once it is" not in page
    assert Order.objects.get(pk=pending_order.pk).status == "payment_pending"

    # The API asked in French answers in English, byte for byte as when asked in English.
    answers = [
        shopper_client.post(
            f"/api/v1/orders/{pending_order.pk}/cancel/",
            format="json",
            HTTP_IDEMPOTENCY_KEY=f"cancel-{language}",
            HTTP_ACCEPT_LANGUAGE=language,
        )
        for language in ("fr", "en")
    ]
    assert answers[0].status_code == answers[1].status_code == 409, answers[0].content
    assert answers[0].content == answers[1].content
    assert answers[0].json()["detail"] == (
        "The payment's outcome is not known yet; cancel once it is."
    )


def test_a_refused_refund_reads_in_french_in_the_admin(staff, pending_order):
    """An order with no payment yet: the refund form's refusal (`orders.operations`)."""
    staff.cookies.load({settings.LANGUAGE_COOKIE_NAME: "fr"})
    url = reverse("admin:orders_order_refund", args=[pending_order.pk])
    form = staff.get(url).content.decode()
    key = form.split('name="idempotency_key" value="', 1)[1].split('"', 1)[0]
    refused = staff.post(url, {"amount": "5.00", "reason": "geste", "idempotency_key": key})
    assert refused.status_code == 303 and refused["Location"].startswith(url)
    page = _page(staff, refused["Location"])
    assert "Rien à rembourser : la commande n&#x27;a aucun paiement." in page
    assert "Nothing to refund" not in page
