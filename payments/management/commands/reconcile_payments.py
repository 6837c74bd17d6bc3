"""`manage.py reconcile_payments`: compare the provider's ledger with the shop's books."""

import json

from django.core.management.base import BaseCommand, CommandError

from payments.gateway import ProviderUnreachable
from payments.reconciliation import reconcile_payments


class Command(BaseCommand):
    help = (
        "Read the provider's ledger over HTTP and compare it, per provider key, with the "
        "shop's payment transactions and totals. Exit 1 on any difference, 2 when the "
        "ledger cannot be read."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    def handle(self, *args, **options):
        try:
            report = reconcile_payments()
        except ProviderUnreachable as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2))
        else:
            for diff in report.differences:
                self.stdout.write(f"{diff.kind}\t{diff.key}\t{diff.detail}")
            self.stdout.write(
                f"install {report.install_id}: {report.provider_operations} provider operations, "
                f"{report.shop_transactions} shop transactions, "
                f"{len(report.differences)} differences"
            )
        if not report.clean:
            raise CommandError(f"{len(report.differences)} differences", returncode=1)
