"""The webhooks scenario is discoverable and its requests carry a signature the shop accepts."""

import time

import pytest

from bench.scenarios import discover, webhooks
from payments import webhooks as shop_webhooks

SECRET = "whsec_bench_test"


def test_the_webhooks_scenario_is_discovered():
    scenarios = {s.name: s for s in discover()}
    assert scenarios["webhooks"].module is webhooks
    assert scenarios["webhooks"].description


def test_the_request_builder_signs_the_raw_body_at_the_time_of_the_send():
    body = webhooks.event_body("evt_bench_test_1")
    request = webhooks.signed_request(body, secret=SECRET)

    assert (request.method, request.path, request.body) == ("POST", webhooks.PATH, body)
    header = request.headers[shop_webhooks.SIGNATURE_HEADER]
    timestamp = shop_webhooks.verify_signature(header=header, body=body, secret=SECRET)
    assert abs(timestamp - time.time()) <= 2
    # The body is an event the shop parses: a charge.captured it can store unmatched.
    event = shop_webhooks.parse_event(body)
    assert (event.id, event.type) == ("evt_bench_test_1", shop_webhooks.CHARGE_CAPTURED)


def test_the_signature_binds_the_secret_and_the_body():
    body = webhooks.event_body("evt_bench_test_2")
    header = webhooks.signed_request(body, secret=SECRET).headers[shop_webhooks.SIGNATURE_HEADER]
    with pytest.raises(shop_webhooks.InvalidSignature):
        shop_webhooks.verify_signature(header=header, body=body, secret="another secret")
    with pytest.raises(shop_webhooks.InvalidSignature):
        shop_webhooks.verify_signature(header=header, body=body + b" ", secret=SECRET)


def test_a_request_signed_long_ago_is_refused():
    body = webhooks.event_body("evt_bench_test_3")
    old = webhooks.signed_request(body, secret=SECRET, now=time.time() - 400)
    with pytest.raises(shop_webhooks.InvalidSignature):
        shop_webhooks.verify_signature(
            header=old.headers[shop_webhooks.SIGNATURE_HEADER], body=body, secret=SECRET
        )
