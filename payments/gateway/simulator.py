"""The gateway for the simulated provider (`python -m devtools.simulator`), over HTTP."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal

import requests
import urllib3
from django.conf import settings
from urllib3 import exceptions as transport

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

# What a call that got no answer records as its code: the name requests gives the
# same failure, as the payment's rows have always said (most specific first).
FAILURE_CODES = (
    (transport.NewConnectionError, "ConnectionError"),
    (transport.ConnectTimeoutError, "ConnectTimeout"),
    (transport.ReadTimeoutError, "ReadTimeout"),
    (transport.ProxyError, "ProxyError"),
    (transport.SSLError, "SSLError"),
    (transport.HTTPError, "ConnectionError"),
)


class CallFailed(Exception):
    """No answer from the provider: refused, timed out, reset, cut off."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@dataclass(frozen=True)
class Answer:
    status_code: int
    content: bytes


class ProviderClient:
    """HTTP to the provider's URL through urllib3, the environment read once.

    The proxy, the CA bundle and `.netrc` credentials for the URL are those
    requests would use (`Session.merge_environment_settings`, read once per
    process); the calls themselves go through urllib3, which
    requests wraps: requests' own layer (hooks, cookies, settings merged and
    protocol checks on every call) was about a tenth of a checkout's web CPU
    (docs/performance.md, "The provider call"). No retry and no redirect: a
    call is sent once, and anything but the provider's answer is UNKNOWN.
    """

    def __init__(self, base_url: str) -> None:
        session = requests.Session()
        env = session.merge_environment_settings(base_url, {}, None, None, None)
        verify = env["verify"]
        tls: dict = {}
        if verify is False:
            tls["cert_reqs"] = "CERT_NONE"
        elif isinstance(verify, str) and os.path.isdir(verify):
            tls["ca_cert_dir"] = verify
        else:
            tls["ca_certs"] = requests.utils.DEFAULT_CA_BUNDLE_PATH if verify is True else verify
        proxy = requests.utils.select_proxy(base_url, env["proxies"])
        self.pool = urllib3.ProxyManager(proxy, **tls) if proxy else urllib3.PoolManager(**tls)
        auth = requests.utils.get_netrc_auth(base_url)
        self.headers = urllib3.make_headers(basic_auth=":".join(auth)) if auth else {}

    def send(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        body: dict | None = None,
        params: dict | None = None,
        headers: dict | None = None,
    ) -> Answer:
        """Send one request; raise CallFailed when no answer came back."""
        sent = {**self.headers, **(headers or {})}
        payload = None
        if body is not None:
            payload = json.dumps(body, allow_nan=False).encode()
            sent["Content-Type"] = "application/json"
        try:
            response = self.pool.request(
                method,
                url,
                body=payload,
                fields=params,
                headers=sent,
                timeout=timeout,
                retries=False,
                redirect=False,
            )
        except transport.HTTPError as exc:
            code = next(name for kind, name in FAILURE_CODES if isinstance(exc, kind))
            raise CallFailed(code, f"{code}: {exc}") from exc
        return Answer(response.status, response.data)


_clients: dict[tuple[int, str], ProviderClient] = {}


def _client(base_url: str) -> ProviderClient:
    """Return the process's client for `base_url`; its threads share it.

    urllib3's pool manager is thread-safe, so one client serves every request
    thread of a process. Threads that ask first at the same time may each make
    one; `setdefault` keeps the first and the others are dropped unused. The
    simulator answers HTTP/1.0 (one request per connection), so no connection
    is reused: a lost answer is still a lost connection. Per pid, never shared
    across a fork.
    """
    ident = (os.getpid(), base_url)
    client = _clients.get(ident)
    if client is None:
        client = _clients.setdefault(ident, ProviderClient(base_url))
    return client


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
            response = _client(self.base_url).send(
                "GET",
                f"{self.base_url}/v1/operations",
                params={"key": key},
                timeout=bounded(self.timeout),
            )
        except CallFailed as exc:
            return ProviderResult(Outcome.UNKNOWN, key, code=exc.code, detail=str(exc))
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
                response = _client(self.base_url).send(
                    "GET",
                    f"{self.base_url}/v1/ledger",
                    params=params,
                    timeout=bounded(self.timeout),
                )
                if response.status_code >= 400:
                    raise ValueError(f"the ledger answered {response.status_code}")
                page = json.loads(response.content)
            except (CallFailed, ValueError) as exc:
                raise ProviderUnreachable(f"cannot read the provider's ledger: {exc}") from exc
            yield from page["results"]
            if page["next_after"] is None:
                return
            after = page["next_after"]

    # -- plumbing ----------------------------------------------------------------

    def _post(self, path: str, key: str, body: dict) -> ProviderResult:
        try:
            response = _client(self.base_url).send(
                "POST",
                f"{self.base_url}{path}",
                body=body,
                headers={"Idempotency-Key": key},
                timeout=bounded(self.timeout),
            )
        except CallFailed as exc:
            # Timeout, refused, reset, answer cut off: the call may have happened.
            return ProviderResult(Outcome.UNKNOWN, key, code=exc.code, detail=str(exc))
        return self._classify(key, response, _payload(response), answers=CALL_ANSWERS)

    def _classify(
        self, key: str, response: Answer, payload: dict, *, answers: frozenset[int]
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


def _payload(response: Answer) -> dict:
    """Return the answer's JSON object, or {} for anything else (a proxy's HTML, a bare 404)."""
    try:
        payload = json.loads(response.content)
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}
