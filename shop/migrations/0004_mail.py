"""Shopper e-mails become rows (shop.models.Mail, due work): written by the consumer, sent later."""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("shop", "0003_cart"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Mail",
            fields=[
                (
                    "next_attempt_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("attempts", models.PositiveIntegerField(db_default=0, default=0)),
                (
                    "lease_owner",
                    models.CharField(blank=True, db_default="", default="", max_length=100),
                ),
                ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                ("needs_attention", models.BooleanField(db_default=False, default=False)),
                (
                    "last_error",
                    models.CharField(blank=True, db_default="", default="", max_length=500),
                ),
                ("done_at", models.DateTimeField(blank=True, null=True)),
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("message_id", models.CharField(max_length=255)),
                ("event_type", models.CharField(max_length=64)),
                ("payload", models.JSONField(default=dict)),
                ("address", models.CharField(max_length=254)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "updated_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "user",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("done_at__isnull", True), ("needs_attention", False)),
                        fields=["next_attempt_at"],
                        name="shop_mail_due_idx",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("message_id",), name="shop_mail_message_uniq")
                ],
            },
        ),
    ]
