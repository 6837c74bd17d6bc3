import uuid

import pytest

from core.errors import ApplicationError, NotFound
from orders.selectors import order_get_for_owner_decision, order_get_for_user, order_list_for_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def orders(make_product, make_user, reserve):
    make_product("TEE-M", stock=10)
    alice, bob = make_user(), make_user()
    return alice, bob, reserve({"TEE-M": 1}, owner=alice), reserve({"TEE-M": 1}, owner=bob)


def test_shopper_reads_only_their_own(orders):
    alice, bob, alices, bobs = orders
    assert list(order_list_for_user(user=alice)) == [alices]
    assert order_get_for_user(user=alice, order_id=alices.id) == alices
    with pytest.raises(NotFound):
        order_get_for_user(user=alice, order_id=bobs.id)


def test_staff_read_every_order(orders, make_user):
    staff = make_user(staff=True)
    _, _, alices, bobs = orders
    assert set(order_list_for_user(user=staff)) == {alices, bobs}
    assert order_get_for_user(user=staff, order_id=str(bobs.id)) == bobs


@pytest.mark.parametrize(
    "order_id", ["not-a-uuid", pytest.param(str(uuid.uuid4()), id="random-uuid"), ""]
)
def test_unknown_or_malformed_id_is_not_found(orders, order_id):
    with pytest.raises(NotFound):
        order_get_for_user(user=orders[0], order_id=order_id)


def test_only_the_shopper_decides(orders, make_user):
    """Confirm is the shopper's: a stranger gets 404 (as for a read), staff 403."""
    alice, bob, alices, _ = orders
    assert order_get_for_owner_decision(user=alice, order_id=alices.id) == alices
    with pytest.raises(NotFound):
        order_get_for_owner_decision(user=bob, order_id=alices.id)
    with pytest.raises(ApplicationError) as refused:
        order_get_for_owner_decision(user=make_user(staff=True), order_id=alices.id)
    assert (refused.value.status, refused.value.code) == (403, "permission_denied")
