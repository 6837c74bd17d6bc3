from django.core.management.base import BaseCommand

from shop.demo import DEMO_USERS, demo_orders, demo_seed


class Command(BaseCommand):
    help = "Load the demo catalog and one user per role; a second run creates nothing."

    def handle(self, *args, **options) -> None:
        seed = demo_seed()
        if seed.created_anything:
            self.stdout.write(
                f"Demo data: created {len(seed.products_created)} products and "
                f"{len(seed.users_created)} users "
                f"({len(seed.products_existing) + len(seed.users_existing)} already there)."
            )
        else:
            self.stdout.write("Demo data: already there, created nothing new.")
        placed = demo_orders()
        if placed:
            self.stdout.write("Demo orders of the shopper:")
            for line in placed:
                self.stdout.write(f"  {line}")
        self.stdout.write("Demo users (username / password):")
        for user in DEMO_USERS:
            note = "" if user.username in seed.users_created else "  (existing user, left as is)"
            self.stdout.write(f"  {user.username:<8} / {user.password:<13} {user.role}{note}")
        self.stdout.write(
            "API token: POST /api/v1/auth/token/ with "
            '{"username": "shopper", "password": "shopper-demo"}'
        )
