"""System checks: a process that calls the provider knows where it is (docs/deployment.md,
"Production settings")."""

from django.conf import settings
from django.core import checks


@checks.register()
def provider_url_is_set(app_configs, **kwargs):
    """Refuse an empty PAYMENTS_PROVIDER_URL.

    The development and test settings point at the simulator's port; the
    production settings have no default, so a host that was never told where the
    provider fails its release step (`manage.py release` runs the checks with its
    migrate; every process starts after it) and `manage.py check`, instead of
    sending payments to a loopback port.
    """
    if str(getattr(settings, "PAYMENTS_PROVIDER_URL", "") or "").strip():
        return []
    return [
        checks.Error(
            "PAYMENTS_PROVIDER_URL is not set: the payment provider's address has no default"
            " under the production settings.",
            hint="Set PAYMENTS_PROVIDER_URL to the provider's API, e.g."
            " https://provider.example.com (docs/deployment.md, 'Production settings').",
            id="payments.E001",
        )
    ]
