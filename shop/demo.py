"""Demo data for the run command: a small catalog with stock and one user per role.

Seeding is idempotent the way everything in this shop is: each row is
inserted first and the unique constraint (product sku, username) says
"already there". A second run creates nothing and changes nothing: stock
levels and passwords that were changed since stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from core.money import minor_units, shop_currency
from core.permissions import COURIERS_GROUP
from inventory.services import SkuExists, product_create

User = get_user_model()

USERNAME_CONSTRAINT = "auth_user_username_key"


@dataclass(frozen=True)
class DemoProduct:
    sku: str
    name: str
    price: str
    stock: int


@dataclass(frozen=True)
class DemoUser:
    username: str
    password: str
    role: str
    staff: bool = False
    courier: bool = False


DEMO_PRODUCTS = (
    DemoProduct("TEE-S", "T-shirt, size S", "19.99", 25),
    DemoProduct("TEE-M", "T-shirt, size M", "19.99", 40),
    DemoProduct("TEE-L", "T-shirt, size L", "19.99", 30),
    DemoProduct("MUG", "Enamel mug", "12.50", 50),
    DemoProduct("CAP", "Baseball cap", "15.00", 20),
    DemoProduct("POSTER-A2", "Poster, A2 (last few)", "9.90", 3),
    DemoProduct("SOCKS", "Socks (sold out)", "7.00", 0),
)

DEMO_USERS = (
    DemoUser("shopper", "shopper-demo", "shopper: orders through the API and the storefront"),
    DemoUser("staff", "staff-demo", "staff: staff API actions and the admin (/admin/)", staff=True),
    DemoUser("courier", "courier-demo", "courier: posts tracking events", courier=True),
)


@dataclass
class DemoSeed:
    """What one seeding run created, and what it found already there."""

    products_created: list[str] = field(default_factory=list)
    products_existing: list[str] = field(default_factory=list)
    users_created: list[str] = field(default_factory=list)
    users_existing: list[str] = field(default_factory=list)

    @property
    def created_anything(self) -> bool:
        return bool(self.products_created or self.users_created)


@transaction.atomic
def demo_seed() -> DemoSeed:
    """Create the demo catalog and users that are not there yet; touch nothing else."""
    seed = DemoSeed()
    currency = shop_currency()
    quantum = Decimal(1).scaleb(-minor_units(currency))
    for product in DEMO_PRODUCTS:
        try:
            product_create(
                sku=product.sku,
                name=product.name,
                price=Decimal(product.price).quantize(quantum),
                currency=currency,
                stock=product.stock,
            )
        except SkuExists:
            seed.products_existing.append(product.sku)
        else:
            seed.products_created.append(product.sku)
    for demo_user in DEMO_USERS:
        if _user_create(demo_user):
            seed.users_created.append(demo_user.username)
        else:
            seed.users_existing.append(demo_user.username)
    return seed


def _user_create(demo_user: DemoUser) -> bool:
    """Insert the user; False when the username is taken (then leave that user alone)."""
    user = User(
        username=demo_user.username,
        email=f"{demo_user.username}@demo.invalid",
        is_staff=demo_user.staff,
        # Staff get every permission so that the admin is usable in the demo.
        is_superuser=demo_user.staff,
    )
    user.set_password(demo_user.password)
    try:
        with transaction.atomic():
            user.save(force_insert=True)
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) == (
            USERNAME_CONSTRAINT
        ):
            return False
        raise
    if demo_user.courier:
        user.groups.add(Group.objects.get(name=COURIERS_GROUP))
    return True
