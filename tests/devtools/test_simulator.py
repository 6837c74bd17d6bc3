"""The simulated provider as a black box over HTTP (its own process, its own ledger)."""

import socket
import threading

import pytest
import requests


def post(sim, path, key, **body):
    headers = {"Idempotency-Key": key} if key else {}
    return requests.post(f"{sim.url}{path}", json=body, headers=headers, timeout=5)


def charge(sim, key, method="pm_card_ok", amount="10.00", reference="order-1"):
    return post(
        sim,
        "/v1/captures",
        key,
        amount=amount,
        currency="EUR",
        payment_method=method,
        reference=reference,
    )


def test_same_key_same_outcome_one_movement(simulator):
    first = charge(simulator, "k1")
    again = charge(simulator, "k1")
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    assert len(simulator.charges("k1")) == 1


def test_same_key_other_parameters_is_an_error(simulator):
    assert charge(simulator, "k1").status_code == 201
    reused = charge(simulator, "k1", amount="11.00")
    assert reused.status_code == 422
    assert reused.json()["code"] == "idempotency_key_reused"
    assert [op["amount"] for op in simulator.ledger("k1")] == ["10.00"]


def test_missing_key_and_bad_input_store_nothing(simulator):
    assert charge(simulator, "").status_code == 400
    bad = post(
        simulator,
        "/v1/captures",
        "k2",
        amount=10,
        currency="EUR",
        reference="r",
        payment_method="pm_card_ok",
    )
    assert bad.status_code == 400
    unknown = charge(simulator, "k3", method="pm_card_stolen")
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "invalid_payment_method"
    assert simulator.ledger() == []


def test_declined_is_stored_and_replayed(simulator):
    first = charge(simulator, "k1", method="pm_card_declined")
    assert first.status_code == 402
    assert first.json()["status"] == "declined"
    again = charge(simulator, "k1", method="pm_card_declined")
    assert again.status_code == 402
    assert again.json()["id"] == first.json()["id"]
    assert simulator.charges("k1") == []


def test_unavailable_answers_503_twice_per_key_then_works(simulator):
    statuses = [charge(simulator, "k1", method="pm_card_unavailable").status_code for _ in range(3)]
    assert statuses == [503, 503, 201]
    # Counted per key: another key starts again.
    assert charge(simulator, "k2", method="pm_card_unavailable").status_code == 503
    assert len(simulator.charges("k1")) == 1


def test_timeout_applies_the_charge_and_loses_the_answer(simulator):
    with pytest.raises(requests.Timeout):
        requests.post(
            f"{simulator.url}/v1/captures",
            json={
                "amount": "5.00",
                "currency": "EUR",
                "payment_method": "pm_card_timeout",
                "reference": "r",
            },
            headers={"Idempotency-Key": "k1"},
            timeout=0.5,
        )
    assert len(simulator.charges("k1")) == 1
    assert simulator.state()["stats"]["answers_lost"] == 1
    looked_up = requests.get(f"{simulator.url}/v1/operations", params={"key": "k1"}, timeout=5)
    assert looked_up.status_code == 200
    assert looked_up.json()["status"] == "succeeded"
    # A retry under the same key gets the stored answer, and no second charge.
    assert (
        charge(simulator, "k1", method="pm_card_timeout", amount="5.00", reference="r").status_code
        == 200
    )
    assert len(simulator.charges("k1")) == 1


def test_lookup_of_unknown_key_is_404(simulator):
    response = requests.get(f"{simulator.url}/v1/operations", params={"key": "nope"}, timeout=5)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_rejected_lookups_and_calls_come_from_in_front_of_the_provider(simulator, status):
    """Injected rejections answer without touching the ledger; clearing them restores it."""
    assert charge(simulator, "k1").status_code == 201
    simulator.faults(reject_lookups=status, reject_calls=status)
    lookup = requests.get(f"{simulator.url}/v1/operations", params={"key": "k1"}, timeout=5)
    assert lookup.status_code == status
    if status == 404:
        assert lookup.headers["Content-Type"] == "text/plain"  # bare: no provider code
    else:
        assert "status" not in lookup.json()
    assert charge(simulator, "k2").status_code == status
    assert simulator.charges("k2") == []
    state = simulator.state()
    assert (state["reject_lookups"], state["reject_calls"]) == (status, status)
    assert state["stats"][f"reject_lookups.{status}"] == 1
    assert state["stats"][f"reject_calls.{status}"] == 1

    simulator.faults(reject_lookups=None, reject_calls=None)
    lookup = requests.get(f"{simulator.url}/v1/operations", params={"key": "k1"}, timeout=5)
    assert lookup.status_code == 200 and lookup.json()["status"] == "succeeded"
    assert charge(simulator, "k2").status_code == 201


def test_rejection_faults_accept_only_known_statuses(simulator):
    response = requests.post(
        f"{simulator.control_url}/faults", json={"reject_lookups": 500}, timeout=5
    )
    assert response.status_code == 400
    simulator.faults(reject_lookups=401)
    assert (
        requests.post(f"{simulator.control_url}/reset", json={}, timeout=5).json()["reject_lookups"]
        is None
    )


def test_ledger_survives_a_kill_and_restart(simulator):
    assert charge(simulator, "k1").status_code == 201
    assert charge(simulator, "k2", method="pm_card_unavailable").status_code == 503
    old_port = simulator.port
    simulator.kill()
    simulator.start()
    assert simulator.port == old_port
    assert len(simulator.charges("k1")) == 1
    assert charge(simulator, "k1").status_code == 200
    # The attempt count per key is in the ledger too: one 503 left, then success.
    assert charge(simulator, "k2", method="pm_card_unavailable").status_code == 503
    assert charge(simulator, "k2", method="pm_card_unavailable").status_code == 201


def test_refuse_connections_is_a_real_refusal(simulator):
    simulator.faults(refuse_connections=True)
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", simulator.port), timeout=2),
    ):
        pass
    assert simulator.state()["refusing"] is True
    simulator.faults(refuse_connections=False)
    assert charge(simulator, "k1").status_code == 201


def test_pause_before_apply_holds_the_key_in_use(simulator):
    """A second call under a key in progress gets 409, never a second charge."""
    simulator.faults(pause="before_apply")
    results = {}
    first = threading.Thread(target=lambda: results.update(first=charge(simulator, "k1")))
    first.start()
    simulator.wait_for(lambda s: s["paused"] == 1)
    assert simulator.charges("k1") == []
    second = charge(simulator, "k1")
    assert second.status_code == 409
    assert second.json()["code"] == "idempotency_key_in_use"
    lookup = requests.get(f"{simulator.url}/v1/operations", params={"key": "k1"}, timeout=5)
    assert lookup.status_code == 409
    simulator.release()
    first.join(10)
    assert results["first"].status_code == 201
    assert len(simulator.charges("k1")) == 1


def test_latency_delays_every_call(simulator):
    simulator.faults(latency_ms=800)
    with pytest.raises(requests.Timeout):
        requests.post(
            f"{simulator.url}/v1/captures",
            json={
                "amount": "5.00",
                "currency": "EUR",
                "payment_method": "pm_card_ok",
                "reference": "r",
            },
            headers={"Idempotency-Key": "k1"},
            timeout=0.3,
        )
    simulator.faults(latency_ms=0)
    # The slow call still arrives and is applied once; the retry replays it.
    simulator.wait_for(lambda s: s["ledger"]["operations"].get("capture.succeeded") == 1)
    assert charge(simulator, "k1", amount="5.00", reference="r").status_code == 200


def test_authorize_capture_void_and_refund_bounds(simulator):
    auth = post(
        simulator,
        "/v1/authorizations",
        "a1",
        amount="10.00",
        currency="EUR",
        payment_method="pm_card_ok",
        reference="order-9",
    )
    assert auth.status_code == 201
    cap = post(
        simulator,
        "/v1/captures",
        "c1",
        amount="6.00",
        currency="EUR",
        authorization_key="a1",
        reference="order-9",
    )
    assert cap.status_code == 201
    too_much = post(
        simulator,
        "/v1/captures",
        "c2",
        amount="5.00",
        currency="EUR",
        authorization_key="a1",
        reference="order-9",
    )
    assert too_much.status_code == 400
    assert too_much.json()["code"] == "amount_exceeds_authorization"
    void = post(simulator, "/v1/voids", "v1", authorization_key="a1", reference="order-9")
    assert void.status_code == 201
    assert void.json()["amount"] == "4.00"
    refund = post(
        simulator,
        "/v1/refunds",
        "r1",
        capture_key="c1",
        amount="6.00",
        currency="EUR",
        reference="return-1",
    )
    assert refund.status_code == 201
    again = post(
        simulator,
        "/v1/refunds",
        "r2",
        capture_key="c1",
        amount="0.01",
        currency="EUR",
        reference="return-2",
    )
    assert again.status_code == 400
    assert again.json()["code"] == "amount_exceeds_capture"


def test_events_are_written_with_operations_for_later_webhooks(simulator):
    charge(simulator, "k1")
    charge(simulator, "k2", method="pm_card_declined")
    charge(simulator, "k1")  # a replay writes no second event
    assert simulator.state()["ledger"]["events"] == 2


def test_ledger_filters_by_prefix_and_pages(simulator):
    for i in range(3):
        charge(simulator, f"inst-a:order-{i}:capture", reference=f"order-{i}")
    charge(simulator, "inst-b:order-0:capture", reference="order-0")
    keys = [op["key"] for op in simulator.ledger("inst-a:")]
    assert keys == [f"inst-a:order-{i}:capture" for i in range(3)]
    page = requests.get(
        f"{simulator.url}/v1/ledger", params={"key_prefix": "inst-a:", "limit": 2}, timeout=5
    ).json()
    assert len(page["results"]) == 2 and page["next_after"] is not None
