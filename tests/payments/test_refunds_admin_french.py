"""The admin in French: a refusal's title and detail, and the status words, are French;
the same refusal through the API stays English (docs/storefront.md, "Languages")."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.urls import reverse

from payments.models import Refund
from tests.payments.test_refunds_admin import form_key, paid_order, staff  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_refused_refund_reads_in_french_in_the_admin_and_in_english_in_the_api(
    staff,  # noqa: F811
    paid_order,  # noqa: F811
    api_client,
    make_user,
):
    staff.cookies.load({settings.LANGUAGE_COOKIE_NAME: "fr"})
    form_url = reverse("admin:orders_order_refund", args=[paid_order.pk])
    key = form_key(staff.get(form_url))
    too_much = staff.post(form_url, {"amount": "25.00", "reason": "x", "idempotency_key": key})
    assert too_much.status_code == 303
    page = staff.get(too_much["Location"]).content.decode()
    assert "Remboursement supérieur à l&#x27;encaissé" in page  # the title
    assert "peuvent encore être remboursés" in page  # the detail
    assert "can still be refunded" not in page
    assert Refund.objects.count() == 0

    # The API asked in French answers in English, byte for byte as before.
    boss = make_user(staff=True, username="api-boss", actions=True)
    api_client.force_authenticate(boss)
    answer = api_client.post(
        f"/api/v1/orders/{paid_order.pk}/refunds/",
        {"amount": "25.00", "currency": "EUR", "reason": "x"},
        format="json",
        HTTP_IDEMPOTENCY_KEY="refund-too-much",
        HTTP_ACCEPT_LANGUAGE="fr",
    )
    assert answer.status_code == 422, answer.content
    assert answer.json()["detail"] == (
        "At most 20.00 EUR can still be refunded (captured 20.00, refunded or being "
        "refunded 0.00); asked 25.00."
    )


def test_the_order_page_shows_status_words_in_french(staff, paid_order):  # noqa: F811
    staff.cookies.load({settings.LANGUAGE_COOKIE_NAME: "fr"})
    page = staff.get(reverse("admin:orders_order_change", args=[paid_order.pk])).content.decode()
    assert "Confirmée" in page and "Encaissé" in page and "Non expédiée" in page
    # The events' statuses are words too, not codes.
    assert "→ confirmed" in page  # the event's own str (its title) keeps the codes
    assert ">confirmed<" not in page
