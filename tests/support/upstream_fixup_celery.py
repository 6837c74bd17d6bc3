"""The shop's Celery app as `config.celery` builds it, but with Celery's own Django fixup.

The wrong twin of core/patches/celery_django.py: a worker started with
`--app tests.support.upstream_fixup_celery:app` closes its database pool
around every task, as Celery does (tests/patches/test_celery_django.py).
"""

from celery import Celery

from config import celery as shop

app = Celery("shop", amqp=shop.BoundedPublishAMQP, task_cls=shop.DatabaseClockTask)
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
