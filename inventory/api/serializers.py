from django.core.validators import RegexValidator
from rest_framework import serializers

from core.fields import ClosedSerializer, StrictCharField, StrictIntegerField
from core.money import MoneyField

SKU_REGEX = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class ProductOut(serializers.Serializer):
    sku = serializers.CharField()
    name = serializers.CharField()
    price = MoneyField()
    currency = serializers.CharField()
    available = serializers.IntegerField()


class ProductIn(ClosedSerializer):
    """POST /products/ body: JSON types as documented, no unknown members."""

    sku = StrictCharField(
        max_length=64,
        validators=[RegexValidator(SKU_REGEX, "1-64 letters, digits, '.', '_' or '-'.")],
    )
    name = StrictCharField(max_length=200)
    price = MoneyField()
    currency = StrictCharField(min_length=3, max_length=3)
    stock = StrictIntegerField(min_value=0, max_value=1_000_000_000, default=0)


class StockIn(ClosedSerializer):
    """POST /products/{sku}/stock/ body: exactly one of `delta` and `set`."""

    # Closed and exactly one member (core.schema).
    openapi_extra = {"minProperties": 1, "maxProperties": 1}

    delta = StrictIntegerField(required=False, min_value=-1_000_000_000, max_value=1_000_000_000)
    set = StrictIntegerField(required=False, min_value=0, max_value=1_000_000_000)

    def validate(self, attrs: dict) -> dict:
        if ("delta" in attrs) == ("set" in attrs):
            raise serializers.ValidationError("Give exactly one of delta and set.")
        return {"delta": attrs.get("delta"), "set_to": attrs.get("set")}


class StockOut(serializers.Serializer):
    sku = serializers.CharField(source="product.sku")
    on_hand = serializers.IntegerField()
    reserved = serializers.IntegerField()
    available = serializers.IntegerField()
