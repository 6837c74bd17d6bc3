"""`?page_size=`: a positive integer, capped at 200; anything else is a 400 problem."""

import pytest

from tests.conftest import assert_problem

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", " 2", "1_0", "\u00b2", ""])
def test_bad_page_size_is_400(api_client, make_product, value):
    make_product("MUG")
    body = assert_problem(
        api_client.get("/api/v1/products/", {"page_size": value}), 400, "invalid_request"
    )
    assert "page_size" in body["errors"]


def test_page_size_above_200_gives_200(api_client, make_product):
    for i in range(201):
        make_product(f"SKU-{i:03}", stock=0)
    response = api_client.get("/api/v1/products/", {"page_size": "99999999999999999999"})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 200
    assert response.json()["next"] is not None


def test_page_size_is_kept_in_the_next_link(api_client, make_product):
    for sku in ("A", "B", "C"):
        make_product(sku)
    first = api_client.get("/api/v1/products/", {"page_size": "2"}).json()
    assert [p["sku"] for p in first["results"]] == ["A", "B"]
    second = api_client.get(first["next"]).json()
    assert [p["sku"] for p in second["results"]] == ["C"]
    assert second["next"] is None
