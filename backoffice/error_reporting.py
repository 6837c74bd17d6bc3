"""Optional error reporting to Sentry (docs/operations.md, "Error reporting").

Off unless `SENTRY_DSN` is set; then web and worker processes report
unhandled errors (and ERROR log lines, which is how the problem middleware
and the tasks record them) through Sentry's Django and Celery integrations.
Personal data stays out: no user, address, cookie or request body is sent
(the `data_collection` below), and request keys are never logged in clear
anyway (docs/operations.md, "Logs").
"""

from __future__ import annotations

from typing import Any


def error_reporting_init(
    *, dsn: str, environment: str, release: str, transport: Any = None
) -> bool:
    """Start Sentry for this process; return False (nothing started) when `dsn` is empty."""
    if not dsn:
        return False
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.integrations.django import DjangoIntegration

    sentry_sdk.init(
        dsn=dsn,
        environment=environment,
        release=release,
        integrations=[DjangoIntegration(), CeleryIntegration()],
        # Personal data off (superseding the deprecated send_default_pii=False):
        # no user identity, cookies, request headers or bodies, query strings or
        # frame locals (a frame may hold an address or a token).
        data_collection={
            "user_info": False,
            "cookies": {"mode": "off"},
            "http_headers": {"request": {"mode": "off"}},
            "http_bodies": [],
            "url_query_params": {"mode": "off"},
            "stack_frame_variables": False,
        },
        traces_sample_rate=0.0,
        transport=transport,
    )
    return True
