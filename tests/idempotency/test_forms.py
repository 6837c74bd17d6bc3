"""The plain-Django form equivalent: the key travels in a hidden form field."""

import re

import pytest
from django.template import Context, Template

from idempotency.models import IdempotencyKey
from tests.support.models import ProbeRecord

pytestmark = pytest.mark.django_db

URL = "/_test/probe-form/"


@pytest.fixture
def browser(client, shopper):
    client.force_login(shopper)
    return client


def form_key(response) -> str:
    return re.search(r'name="idempotency_key" value="([^"]+)"', response.content.decode())[1]


def test_rendered_form_carries_a_fresh_key(browser):
    first, second = browser.get(URL), browser.get(URL)
    assert first.status_code == 200
    assert form_key(first) != form_key(second)


def test_template_tag_renders_the_hidden_field():
    html = Template("{% load idempotency %}{% idempotency_key_field %}").render(Context())
    assert re.fullmatch(r'<input type="hidden" name="idempotency_key" value="[0-9a-f]{32}">', html)


def test_double_submit_makes_one_effect_and_the_same_redirect(browser):
    key = form_key(browser.get(URL))
    data = {"idempotency_key": key, "label": "form", "amount": "2"}
    first = browser.post(URL, data)
    assert first.status_code == 303
    record = ProbeRecord.objects.get()
    assert first["Location"] == f"/_test/probe-form/{record.id}/"
    second = browser.post(URL, data)
    assert second.status_code == 303 and second["Location"] == first["Location"]
    assert second["Idempotent-Replayed"] == "true"
    assert ProbeRecord.objects.count() == 1
    assert browser.get(first["Location"]).status_code == 200


def test_csrf_token_is_not_part_of_the_fingerprint(browser):
    key = form_key(browser.get(URL))
    data = {"idempotency_key": key, "label": "form", "amount": "2"}
    first = browser.post(URL, {**data, "csrfmiddlewaretoken": "one"})
    second = browser.post(URL, {**data, "csrfmiddlewaretoken": "two"})
    assert second["Idempotent-Replayed"] == "true" and second["Location"] == first["Location"]


def test_changed_values_under_the_same_key_are_refused(browser):
    key = form_key(browser.get(URL))
    browser.post(URL, {"idempotency_key": key, "label": "form", "amount": "2"})
    refused = browser.post(URL, {"idempotency_key": key, "label": "other", "amount": "2"})
    assert refused.status_code == 422
    assert "already submitted" in refused.content.decode()
    assert ProbeRecord.objects.count() == 1


def test_missing_key_is_refused(browser):
    response = browser.post(URL, {"label": "form", "amount": "2"})
    assert response.status_code == 400
    assert not IdempotencyKey.objects.exists()


def test_invalid_form_is_rerendered_and_claims_nothing(browser):
    key = form_key(browser.get(URL))
    response = browser.post(URL, {"idempotency_key": key, "label": "form", "amount": "many"})
    assert response.status_code == 400
    assert not IdempotencyKey.objects.exists()
    fixed = browser.post(URL, {"idempotency_key": key, "label": "form", "amount": "3"})
    assert fixed.status_code == 303


def test_anonymous_submission_goes_to_login(client):
    response = client.post(URL, {"idempotency_key": "k", "label": "x", "amount": "1"})
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_submission_while_the_first_runs_gets_a_409_page(browser, shopper):
    from tests.support.servers import key_hold

    key_hold(
        owner_id=shopper.pk,
        key="running",
        operation="probe.run",
        path=URL,
        body={"label": ["form"], "amount": ["2"]},
    )
    response = browser.post(URL, {"idempotency_key": "running", "label": "form", "amount": "2"})
    assert response.status_code == 409 and int(response["Retry-After"]) >= 1
    assert "being submitted" in response.content.decode()
    assert not ProbeRecord.objects.exists()
