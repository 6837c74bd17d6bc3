"""WSGI entry of the Oscar peer (`gunicorn bench.oscar.wsgi:application`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.oscar.settings")
application = get_wsgi_application()
