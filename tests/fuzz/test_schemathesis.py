"""Schemathesis against `/api/schema/` on a real gunicorn (issue 16, docs/testing.md "Fuzzing").

One test per role (shopper, staff). Each loads the OpenAPI document the
server publishes, and for every operation runs a fixed number of positive
and negative cases (Hypothesis, derandomized: the same cases every run;
`SHOP_FUZZ_EXAMPLES` raises the number for a long run). Every case gets a
fresh `Idempotency-Key`, so keyed endpoints get past the 400 for a missing
or invalid key; path parameters are sometimes the ids of real seeded objects
(products, the shopper's orders, a shipment, a return).

Every answer must: not be a 5xx; be `application/problem+json` with `type`,
`title`, `status` and `code` when it is an error; have a documented status
code, content type, headers and a body that conforms to the schema. The test
collects every failure over all operations and reports them together, with a
curl command for each. `-s` prints the statuses per operation and mode;
`SHOP_FUZZ_DEBUG=1` also prints every 400 with the body that caused it.
"""

from __future__ import annotations

import copy
import os
import re
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import pytest
import requests
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

from core.api_tokens import api_token_issue
from tests.orders.conftest import ADDRESS

schemathesis = pytest.importorskip("schemathesis")

from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("SHOP_FUZZ_EXAMPLES", "20"))
WEBHOOK = "/api/v1/payments/webhooks/"
# Deleting the account ends the caller's token: fuzzed last.
LAST = ("DELETE /api/v1/auth/account/",)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
PROBLEM_MEMBERS = ("type", "title", "status", "code")


@dataclass
class Tally:
    """What one role's run saw: answers by status, failures with their reproducers."""

    statuses: Counter = field(default_factory=Counter)
    counted: int = 0
    not_400: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    by_operation: defaultdict = field(default_factory=lambda: defaultdict(Counter))

    def share(self) -> float:
        return self.not_400 / self.counted if self.counted else 0.0


def _problem_failure(response: requests.Response) -> str | None:
    """Why an error answer is not an RFC 9457 problem document (None when it is one)."""
    if response.status_code < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if not content_type.startswith("application/problem+json"):
        return f"error {response.status_code} with Content-Type {content_type!r}"
    try:
        body = response.json()
    except ValueError:
        return f"error {response.status_code}: body is not JSON"
    if not isinstance(body, dict):
        return f"error {response.status_code}: body is not an object"
    missing = [name for name in PROBLEM_MEMBERS if name not in body]
    if missing:
        return f"error {response.status_code}: problem without {missing}"
    if body["status"] != response.status_code:
        return f"problem status {body['status']} on a {response.status_code} answer"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", str(body["code"])):
        return f"problem code {body['code']!r} is not snake_case"
    return None


def _seed(server_url: str, shopper_token: str, staff_token: str, products) -> dict[str, list]:
    """Real objects for path parameters, made through the API itself."""

    def post(path, token, body):
        response = requests.post(
            server_url + path,
            json=body,
            headers={"Authorization": f"Token {token}", "Idempotency-Key": str(uuid.uuid4())},
            timeout=30,
        )
        assert response.status_code < 300, (path, response.status_code, response.text[:500])
        return response.json()

    def order(lines, on_shortage="reject"):
        return post(
            "/api/v1/orders/",
            shopper_token,
            {
                "lines": [{"sku": sku, "quantity": q} for sku, q in lines.items()],
                "on_shortage": on_shortage,
                "payment_method": "pm_card_ok",
                "shipping_address": ADDRESS,
            },
        )

    confirmed = order({"FUZZ-TEE": 2, "FUZZ-MUG": 1})
    shipped = order({"FUZZ-TEE": 1})
    awaiting = order({"FUZZ-TEE": 1, "FUZZ-LAST": 3}, on_shortage="ask")
    assert awaiting["status"] == "awaiting_decision", awaiting
    shipment = post(f"/api/v1/orders/{shipped['id']}/shipments/", staff_token, {})
    returned = post(
        f"/api/v1/orders/{shipped['id']}/returns/",
        shopper_token,
        {"lines": [{"sku": "FUZZ-TEE", "quantity": 1}], "reason": "too small"},
    )
    return {
        "sku": [p.sku for p in products],
        "order_id": [confirmed["id"], shipped["id"], awaiting["id"]],
        "shipment_id": [shipment["id"]],
        "return_id": [returned["id"]],
    }


def _real_skus(strategy, skus: list[str]):
    """The same cases, with the body's `lines[].sku` replaced by distinct real skus."""

    @st.composite
    def build(draw):
        case = draw(strategy)
        body = copy.deepcopy(case.body) if isinstance(case.body, dict) else None
        if body and isinstance(body.get("lines"), list):
            chosen = draw(st.permutations(skus))
            for line, sku in zip(body["lines"], chosen, strict=False):
                if isinstance(line, dict):
                    line["sku"] = sku
            case.body = body
        return case

    return build()


def _strategy(operation, mode: GenerationMode, real: dict[str, list]):
    """Generated cases, and as many again whose path parameters and skus name real objects."""
    positive_body = mode is GenerationMode.POSITIVE and bool(operation.body)
    generated = operation.as_strategy(generation_mode=mode)
    strategies = [generated]
    if positive_body:
        strategies.append(_real_skus(generated, real["sku"]))
    for name in (p.name for p in operation.path_parameters):
        for value in real.get(name, []):
            strategy = operation.as_strategy(generation_mode=mode, path_parameters={name: value})
            strategies.append(_real_skus(strategy, real["sku"]) if positive_body else strategy)
    return st.one_of(*strategies)


def _fuzz_operation(operation, *, base_url: str, token: str, real, tally: Tally) -> None:
    label = f"{operation.method.upper()} {operation.path}"
    webhook = operation.path == WEBHOOK

    def run(case) -> None:
        headers = {"Authorization": f"Token {token}"}
        if any(p.name == "Idempotency-Key" for p in operation.headers):
            # A fresh, valid key: the case gets past the key checks to the body and domain.
            headers["Idempotency-Key"] = str(uuid.uuid4())
        try:
            # A fresh session per case: no cookie (register's login) leaks into the next one.
            with requests.Session() as session:
                response = case.call(
                    base_url=base_url, session=session, headers=headers, timeout=30
                )
        except requests.RequestException as exc:
            tally.failures.setdefault(f"{label}: transport", repr(exc))
            return
        tally.statuses[response.status_code] += 1
        tally.by_operation[f"{label} {case.meta.generation.mode.value}"][response.status_code] += 1
        if os.environ.get("SHOP_FUZZ_DEBUG") and response.status_code == 400:
            print("DEBUG", label, case.meta.generation.mode.value, case.body, response.text[:400])
        if not webhook:
            tally.counted += 1
            tally.not_400 += response.status_code != 400
        problem = _problem_failure(response)
        if problem:
            tally.failures.setdefault(
                f"{label}: {problem}",
                case.as_curl_command(headers=headers, base_url=base_url)
                + "\n"
                + response.text[:300],
            )
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:  # collect every failure, report them together
            for failure in group.exceptions:
                tally.failures.setdefault(
                    f"{label}: {failure.title}",
                    f"{failure.message}\n[{response.status_code}] {response.text[:300]}\n"
                    + case.as_curl_command(headers=headers, base_url=base_url),
                )

    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        test = settings(
            max_examples=EXAMPLES,
            derandomize=True,
            database=None,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )(given(case=_strategy(operation, mode, real))(run))
        try:
            test()
        except Unsatisfiable:
            # Nothing can be invalid (e.g. no parameters, or only free strings): no negative case.
            if mode is not GenerationMode.NEGATIVE:
                tally.failures.setdefault(f"{label} ({mode.value}): unsatisfiable", "")
        except Exception as exc:  # noqa: BLE001 - e.g. a schema Hypothesis cannot satisfy
            tally.failures.setdefault(f"{label} ({mode.value}): generation", repr(exc)[:1500])


@pytest.fixture
def fuzz_shop(gunicorn, tmp_path, make_user, make_product):
    """A real gunicorn (and payment simulator) on the test database, seeded."""
    from tests.support.simulator import Simulator

    simulator = Simulator(tmp_path).start()
    try:
        products = [
            make_product("FUZZ-TEE", price="19.99", stock=50),
            make_product("FUZZ-MUG", price="7.50", stock=20),
            make_product("FUZZ-LAST", price="3.00", stock=1),
        ]
        shopper = make_user()
        staff = make_user(actions=True)
        server = gunicorn(
            workers=2,
            PAYMENTS_PROVIDER_URL=simulator.url,
            PAYMENTS_PROVIDER_TIMEOUT="2",
            SHOP_TOKEN_THROTTLE_RATE="1000/min",
            SHOP_REGISTER_THROTTLE_RATE="1000/min",
            DB_POOL_MAX="2",
        )
        tokens = {
            "shopper": api_token_issue(user=shopper).key,
            "staff": api_token_issue(user=staff).key,
        }
        real = _seed(server.url, tokens["shopper"], tokens["staff"], products)
        yield server, tokens, real
    finally:
        simulator.stop()


@pytest.mark.parametrize("role", ["shopper", "staff"])
def test_fuzz_api_schema(fuzz_shop, role, record_property):
    server, tokens, real = fuzz_shop
    schema = schemathesis.openapi.from_url(f"{server.url}/api/schema/")
    operations = [result.ok() for result in schema.get_all_operations()]
    operations.sort(key=lambda op: f"{op.method.upper()} {op.path}" in LAST)
    tally = Tally()
    for operation in operations:
        _fuzz_operation(operation, base_url=server.url, token=tokens[role], real=real, tally=tally)
    statuses = dict(sorted(tally.statuses.items()))
    summary = (
        f"{role}: {sum(statuses.values())} answers, statuses {statuses}; "
        f"non-400 share (webhook excluded) {tally.not_400}/{tally.counted} = {tally.share():.0%}"
    )
    print(summary)
    for name, counts in sorted(tally.by_operation.items()):
        print(f"  {name}: {dict(sorted(counts.items()))}")
    record_property("fuzz_summary", summary)
    assert not tally.failures, (
        summary
        + f"\n{len(tally.failures)} distinct failures:\n\n"
        + "\n\n".join(f"## {name}\n{detail}" for name, detail in sorted(tally.failures.items()))
    )
    assert 5 not in {status // 100 for status in tally.statuses}
