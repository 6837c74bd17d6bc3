"""The lease TTL must outlast one phase plus the provider calls between two renewals."""

from django.test import override_settings

from idempotency.checks import lock_ttl_covers_outside_calls


def test_default_ttl_passes():
    assert lock_ttl_covers_outside_calls(None) == []


@override_settings(
    IDEMPOTENCY_LEASE_TTL=20, PAYMENTS_PROVIDER_TIMEOUT=10, PAYMENTS_PROVIDER_ATTEMPTS=2
)
def test_short_ttl_warns():
    (warning,) = lock_ttl_covers_outside_calls(None)
    assert warning.id == "idempotency.W001"
