"""TransactionStatus.PENDING ("pending") -> TransactionStatus.UNKNOWN ("unknown").

A provider call whose outcome is not known yet is "unknown" (docs/glossary.md,
"outcome"); "pending" stays the contract's payment status only. The stored
rows are rewritten in the same migration; reversing writes "pending" back.
"""

from django.db import migrations, models

FORWARD = "UPDATE payments_paymenttransaction SET status = 'unknown' WHERE status = 'pending'"
BACKWARD = "UPDATE payments_paymenttransaction SET status = 'pending' WHERE status = 'unknown'"


class Migration(migrations.Migration):
    dependencies = [
        ("payments", "0003_refunds"),
    ]

    operations = [
        migrations.AlterField(
            model_name="paymenttransaction",
            name="status",
            field=models.CharField(
                choices=[
                    ("unknown", "Unknown"),
                    ("succeeded", "Succeeded"),
                    ("declined", "Declined"),
                ],
                default="unknown",
                max_length=16,
            ),
        ),
        migrations.RunSQL(FORWARD, reverse_sql=BACKWARD, elidable=False),
    ]
