"""System checks: the lease TTL must outlast the longest phase plus one outside call."""

from django.conf import settings
from django.core import checks


@checks.register()
def lock_ttl_covers_outside_calls(app_configs, **kwargs):
    """Warn when IDEMPOTENCY_LEASE_TTL is not longer than the provider calls a run makes."""
    ttl = float(settings.IDEMPOTENCY_LEASE_TTL)
    timeout = float(getattr(settings, "PAYMENTS_PROVIDER_TIMEOUT", 0) or 0)
    attempts = int(getattr(settings, "PAYMENTS_PROVIDER_ATTEMPTS", 1) or 1)
    needed = timeout * attempts + float(settings.IDEMPOTENCY_LEASE_MARGIN)
    if ttl <= needed:
        return [
            checks.Warning(
                f"IDEMPOTENCY_LEASE_TTL ({ttl:g} s) should exceed the provider timeout x "
                f"attempts + margin ({needed:g} s), or a slow run can be taken over.",
                id="idempotency.W001",
            )
        ]
    return []
