"""Serializers built once per thread answer as fresh ones do (core/serializers.py).

The same validated data, the same errors (a `null` body's edge case
included), the same rendered dicts; each thread has its own instance. The
wrong twin (one instance for every thread, validated without the fresh
fallback) loses the `null` edge case, which is why a refused body goes
through `is_valid` again.
"""

from __future__ import annotations

import threading

import pytest
from rest_framework import serializers
from rest_framework.exceptions import ValidationError

from core.fields import ClosedSerializer, StrictCharField, StrictIntegerField
from core.serializers import represented, thread_serializer, validated


class LineIn(ClosedSerializer):
    sku = StrictCharField(max_length=8)
    quantity = StrictIntegerField(min_value=1)


class AddressIn(ClosedSerializer):
    city = StrictCharField()
    country = serializers.RegexField(r"^[A-Za-z]{2}$")

    def validate_country(self, value: str) -> str:
        return value.upper()


class BodyIn(ClosedSerializer):
    lines = LineIn(many=True, allow_empty=False)
    address = AddressIn()
    note = StrictCharField(required=False)

    def validate(self, attrs: dict) -> dict:
        if attrs.get("note") == "refuse":
            raise serializers.ValidationError("refused")
        return attrs


class LineOut(serializers.Serializer):
    sku = serializers.CharField()
    quantity = serializers.IntegerField()


class BodyOut(serializers.Serializer):
    lines = LineOut(many=True)
    city = serializers.CharField(source="address.city")
    size = serializers.SerializerMethodField()

    def get_size(self, value) -> int:
        return len(value["lines"])


GOOD = {"lines": [{"sku": "A", "quantity": 2}], "address": {"city": "X", "country": "de"}}
BAD = [
    None,
    [],
    "text",
    {},
    {**GOOD, "extra": 1},
    {**GOOD, "lines": []},
    {**GOOD, "lines": [{"sku": "A", "quantity": "2"}]},
    {**GOOD, "lines": [{"sku": "TOO-LONG-SKU", "quantity": 0}]},
    {**GOOD, "address": {"city": 3, "country": "DEU"}},
    {**GOOD, "note": "refuse"},
]


def _fresh(data):
    serializer = BodyIn(data=data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _errors(call, data):
    with pytest.raises(ValidationError) as caught:
        call(data)
    return caught.value.detail


def test_an_accepted_body_gives_what_a_fresh_serializer_gives():
    for _ in range(3):
        assert validated(BodyIn, GOOD) == _fresh(GOOD)
    assert validated(BodyIn, GOOD)["address"]["country"] == "DE"


@pytest.mark.parametrize("data", BAD, ids=range(len(BAD)))
def test_a_refused_body_raises_the_error_a_fresh_serializer_raises(data):
    validated(BodyIn, GOOD)  # the thread's instance exists and has validated before
    assert _errors(lambda d: validated(BodyIn, d), data) == _errors(_fresh, data)


def test_the_wrong_twin_without_the_fresh_fallback_loses_the_null_edge_case():
    """DRF's `is_valid` says "No data provided" for a null body; run_validation alone does not."""
    twin = _errors(thread_serializer(BodyIn).run_validation, None)
    assert twin != _errors(_fresh, None)
    assert _errors(lambda d: validated(BodyIn, d), None) == _errors(_fresh, None)


def test_rendering_gives_what_a_fresh_serializer_gives():
    value = {**GOOD, "lines": [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 2}]}
    assert represented(BodyOut, value) == dict(BodyOut(value).data)
    assert list(represented(BodyOut, value)) == ["lines", "city", "size"]


def test_each_thread_has_its_own_instance_with_every_nested_field_bound():
    seen: list = []

    def build() -> None:
        seen.append(thread_serializer(BodyIn))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen[0] is not seen[1]
    here = thread_serializer(BodyIn)
    assert here is thread_serializer(BodyIn)
    assert "fields" in here.fields["lines"].child.__dict__  # bound when built
    assert "fields" in here.fields["address"].__dict__
