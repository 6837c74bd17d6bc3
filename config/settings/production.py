"""Production settings: everything secret or host-specific must come from the environment."""

from .base import *  # noqa: F401,F403
from .base import env

SECRET_KEY = env.str("SECRET_KEY")
# The provider's webhooks are authenticated by this secret alone: no default.
PAYMENTS_WEBHOOK_SECRET = env.str("PAYMENTS_WEBHOOK_SECRET")
DEBUG = False
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
