"""Strict JSON input fields: what the client sent is what it meant, or a 400."""

from __future__ import annotations

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """A JSON string, never a number or a boolean coerced into one."""

    default_error_messages = {"not_string": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_string")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: not a string, a float (even 2.0) or a boolean."""

    default_error_messages = {"not_integer": "Must be an integer."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("not_integer")
        return super().to_internal_value(data)


class ClosedSerializer(serializers.Serializer):
    """Refuse members the serializer does not define, so a typo is not silently ignored."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)
