"""The gateway for the simulated provider (`python -m payments.simulator`), over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import requests
from django.conf import settings

from core.money import format_money

from .base import Outcome, PaymentGateway, ProviderResult, ProviderUnreachable

# 4xx answers that do not prove the provider did nothing under this key:
# 408 timeout, 409 the same key is in progress, 422 the key was used with other
# parameters (an earlier call may have moved money), 429 throttled.
UNCERTAIN_4XX = frozenset({408, 409, 422, 429})


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
        body = {
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
            response = requests.get(
                f"{self.base_url}/v1/operations", params={"key": key}, timeout=self.timeout
            )
        except requests.RequestException as exc:
            return ProviderResult(Outcome.UNKNOWN, key, code=type(exc).__name__, detail=str(exc))
        if response.status_code == 404:
            return ProviderResult(Outcome.NOT_FOUND, key, http_status=404)
        return self._classify(key, response)

    def operations(self, *, key_prefix: str) -> Iterator[dict]:
        after = 0
        while True:
            try:
                response = requests.get(
                    f"{self.base_url}/v1/ledger",
                    params={"key_prefix": key_prefix, "after": after, "limit": 500},
                    timeout=self.timeout,
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
            response = requests.post(
                f"{self.base_url}{path}",
                json=body,
                headers={"Idempotency-Key": key},
                timeout=self.timeout,
            )
        except requests.RequestException as exc:
            # Timeout, refused, reset, answer cut off: the call may have happened.
            return ProviderResult(Outcome.UNKNOWN, key, code=type(exc).__name__, detail=str(exc))
        return self._classify(key, response)

    def _classify(self, key: str, response: requests.Response) -> ProviderResult:
        status = response.status_code
        try:
            payload = response.json()
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        code = str(payload.get("code", ""))
        detail = str(payload.get("detail", ""))
        if status in (200, 201, 402) and "status" in payload:
            outcome = {"succeeded": Outcome.SUCCESS, "declined": Outcome.DECLINED}.get(
                payload["status"], Outcome.UNKNOWN
            )
            return ProviderResult(outcome, key, operation=payload, http_status=status, code=code)
        if 400 <= status < 500 and status not in UNCERTAIN_4XX:
            # The provider refused the request itself and stored nothing: final.
            return ProviderResult(
                Outcome.DECLINED, key, http_status=status, code=code, detail=detail
            )
        return ProviderResult(Outcome.UNKNOWN, key, http_status=status, code=code, detail=detail)
