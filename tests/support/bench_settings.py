"""The bench's gunicorn settings: production's base settings plus the test-only routes."""

from config.settings.base import *  # noqa: F401,F403
from config.settings.base import INSTALLED_APPS

from .settings import *  # noqa: F401,F403
from .settings import TEST_SUPPORT_APPS

INSTALLED_APPS = [*INSTALLED_APPS, *TEST_SUPPORT_APPS]
