"""The gateway for the simulated provider (`python -m devtools.simulator`), over HTTP."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from decimal import Decimal

import requests
from django.conf import settings

from core.deadline import bounded
from core.money import format_money

from .base import Outcome, PaymentGateway, ProviderResult, ProviderUnreachable

# Only the provider's own explicit answers are final. Anything else between
# the shop and the provider (a proxy, a firewall, a rotated API key, a
# misrouted path) can answer 4xx without the provider ever seeing the call,
# and says nothing about a charge that may already stand under the key.
OPERATION_STATUS = {"succeeded": Outcome.SUCCEEDED, "declined": Outcome.DECLINED}
CALL_ANSWERS = frozenset({200, 201, 402})  # replayed, new, declined
LOOKUP_ANSWERS = frozenset({200})
NOT_FOUND_CODE = "not_found"  # the provider's look-up answer for a key it never stored


_sessions = threading.local()


def _session(base_url: str) -> requests.Session:
    """Return this thread's HTTP session for `base_url`, made once per process and thread.

    `requests.post()` builds a Session per call and, with `trust_env`, reads
    the proxy variables, `.netrc` and the CA-bundle variables again on every
    call (a third of the call's CPU). The session here resolves exactly those
    settings once, from the same environment, for the provider's URL, and
    then stops re-reading them. The simulator answers HTTP/1.0 (one request
    per connection), so no connection is reused: a lost answer is still a
    lost connection. Per thread (a Session is not thread-safe) and per pid
    (never shared across a fork).
    """
    cache: dict[tuple[int, str], requests.Session] | None = getattr(_sessions, "cache", None)
    if cache is None:
        cache = _sessions.cache = {}
    ident = (os.getpid(), base_url)
    session = cache.get(ident)
    if session is None:
        session = requests.Session()
        settings_ = session.merge_environment_settings(base_url, {}, None, None, None)
        session.proxies = settings_["proxies"]
        session.verify = settings_["verify"]
        session.auth = requests.utils.get_netrc_auth(base_url)
        session.trust_env = False
        cache[ident] = session
    return session


class SimulatorGateway(PaymentGateway):
    """Talk to the simulator at `settings.PAYMENTS_PROVIDER_URL`."""

    def __init__(self, *, base_url: str | None = None, timeout: float | None = None) -> None:
        self.base_url = (base_url or settings.PAYMENTS_PROVIDER_URL).rstrip("/")
        self.timeout = timeout if timeout is not None else settings.PAYMENTS_PROVIDER_TIMEOUT

    # -- mutating calls ----------------------------------------------------------

    def authorize(
        self, *, key: str, amount: Decimal, currency: str, payment_method: str, reference: str
    ) -> ProviderResult:
        body = {
            "amount": format_money(amount, currency),
            "currency": currency,
            "payment_method": payment_method,
            "reference": reference,
        }
        return self._post("/v1/authorizations", key, body)

    def capture(
        self,
        *,
        key: str,
        amount: Decimal,
        currency: str,
        reference: str,
        payment_method: str | None = None,
        authorization_key: str | None = None,
    ) -> ProviderResult:
        body: dict[str, str | None] = {
            "amount": format_money(amount, currency),
            "currency": currency,
            "reference": reference,
        }
        if authorization_key is not None:
            body["authorization_key"] = authorization_key
        else:
            body["payment_method"] = payment_method
        return self._post("/v1/captures", key, body)

    def void(self, *, key: str, authorization_key: str, reference: str) -> ProviderResult:
        body = {"authorization_key": authorization_key, "reference": reference}
        return self._post("/v1/voids", key, body)

    def refund(
        self, *, key: str, capture_key: str, amount: Decimal, currency: str, reference: str
    ) -> ProviderResult:
        body = {
            "capture_key": capture_key,
            "amount": format_money(amount, currency),
            "currency": currency,
            "reference": reference,
        }
        return self._post("/v1/refunds", key, body)

    # -- reads -------------------------------------------------------------------

    def lookup(self, *, key: str) -> ProviderResult:
        try:
            response = _session(self.base_url).get(
                f"{self.base_url}/v1/operations", params={"key": key}, timeout=bounded(self.timeout)
            )
        except requests.RequestException as exc:
            return ProviderResult(Outcome.UNKNOWN, key, code=type(exc).__name__, detail=str(exc))
        payload = _payload(response)
        if response.status_code == 404 and payload.get("code") == NOT_FOUND_CODE:
            return ProviderResult(
                Outcome.NOT_FOUND,
                key,
                http_status=404,
                code=NOT_FOUND_CODE,
                detail=str(payload.get("detail", "")),
            )
        return self._classify(key, response, payload, answers=LOOKUP_ANSWERS)

    def operations(self, *, key_prefix: str) -> Iterator[dict]:
        after = 0
        while True:
            params: dict[str, str | int] = {"key_prefix": key_prefix, "after": after, "limit": 500}
            try:
                response = _session(self.base_url).get(
                    f"{self.base_url}/v1/ledger",
                    params=params,
                    timeout=bounded(self.timeout),
                )
                response.raise_for_status()
                page = response.json()
            except (requests.RequestException, ValueError) as exc:
                raise ProviderUnreachable(f"cannot read the provider's ledger: {exc}") from exc
            yield from page["results"]
            if page["next_after"] is None:
                return
            after = page["next_after"]

    # -- plumbing ----------------------------------------------------------------

    def _post(self, path: str, key: str, body: dict) -> ProviderResult:
        try:
            response = _session(self.base_url).post(
                f"{self.base_url}{path}",
                json=body,
                headers={"Idempotency-Key": key},
                timeout=bounded(self.timeout),
            )
        except requests.RequestException as exc:
            # Timeout, refused, reset, answer cut off: the call may have happened.
            return ProviderResult(Outcome.UNKNOWN, key, code=type(exc).__name__, detail=str(exc))
        return self._classify(key, response, _payload(response), answers=CALL_ANSWERS)

    def _classify(
        self, key: str, response: requests.Response, payload: dict, *, answers: frozenset[int]
    ) -> ProviderResult:
        """Return a final outcome only for the provider's record of this very operation.

        That is an answer with a status in `answers` whose body is the
        operation stored under `key` with its status (a decline also carries
        the provider's decline code). Every other answer, any 4xx included,
        is UNKNOWN: it does not prove that nothing moved under the key.
        """
        status = response.status_code
        code = str(payload.get("code") or payload.get("decline_code") or "")
        detail = str(payload.get("detail", ""))
        op_status = payload.get("status")
        outcome = None
        if payload.get("key") == key and isinstance(op_status, str):
            outcome = OPERATION_STATUS.get(op_status)
        if outcome == Outcome.DECLINED and not payload.get("decline_code"):
            outcome = None
        if status in answers and outcome is not None:
            return ProviderResult(outcome, key, operation=payload, http_status=status, code=code)
        return ProviderResult(Outcome.UNKNOWN, key, http_status=status, code=code, detail=detail)


def _payload(response: requests.Response) -> dict:
    """Return the answer's JSON object, or {} for anything else (a proxy's HTML, a bare 404)."""
    try:
        payload = response.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}
