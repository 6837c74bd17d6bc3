import pytest

pytestmark = pytest.mark.django_db


def test_openapi_schema_lists_the_api(api_client):
    response = api_client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/api/v1/products/",
        "/api/v1/products/{sku}/",
        "/api/v1/auth/register/",
        "/api/v1/auth/token/",
    ):
        assert path in paths


def test_swagger_ui_is_served_without_cdn(api_client):
    response = api_client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn." not in html and "unpkg" not in html and "jsdelivr" not in html
