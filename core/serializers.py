"""DRF serializers built once per thread for the hot requests.

The cost and the profile: docs/performance.md, "Where the checkout's CPU goes".

A DRF serializer deep-copies its declared fields and binds the copies for
every instance, nested serializers included: a keyed checkout's body and
answer rebuilt about forty fields per request, each re-running its
constructor, before a value was looked at. The serializers here keep no
request in their fields (validation returns its value or raises; rendering
returns its dict), so one instance per class and thread, its whole tree of
fields bound at first use, validates and renders every request of that
thread with DRF's own code: the same values, the same errors, the same
bodies byte for byte.

- `validated(OrderIn, data)` is `OrderIn(data=data)` → `is_valid(raise_exception=True)`
  → `validated_data`. A body that fails is validated again by a fresh
  instance so the error is the one `is_valid` raises, edge cases included
  (a `null` body's "No data provided"): a refused body costs its
  validation twice, an accepted one never.
- `represented(OrderOut, instance)` is `dict(OrderOut(instance).data)`.

Only for serializers whose methods read nothing but their arguments: no
`context`, no `instance`, no `initial_data`, no `partial`.
"""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from rest_framework.exceptions import ValidationError
from rest_framework.serializers import BaseSerializer, ListSerializer

S = TypeVar("S", bound=BaseSerializer)

_local = threading.local()


def thread_serializer(serializer_class: type[S]) -> S:
    """This thread's instance of `serializer_class`, every nested field built and bound."""
    built: dict[type, BaseSerializer] | None = getattr(_local, "built", None)
    if built is None:
        built = _local.built = {}
    serializer = built.get(serializer_class)
    if serializer is None:
        serializer = serializer_class()
        _bind_tree(serializer)
        built[serializer_class] = serializer
    return serializer  # type: ignore[return-value]  # built[cls] is a cls


def _bind_tree(serializer: BaseSerializer) -> None:
    if isinstance(serializer, ListSerializer):
        if isinstance(serializer.child, BaseSerializer):
            _bind_tree(serializer.child)
        return
    for field in serializer.fields.values():  # type: ignore[attr-defined]  # a Serializer
        if isinstance(field, BaseSerializer):
            _bind_tree(field)


def validated(serializer_class: type[BaseSerializer], data: Any) -> Any:
    """`serializer_class(data=data)`'s validated data, or the ValidationError `is_valid` raises."""
    try:
        return thread_serializer(serializer_class).run_validation(data)
    except ValidationError:
        serializer = serializer_class(data=data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data


def represented(serializer_class: type[BaseSerializer], instance: Any) -> dict:
    """`dict(serializer_class(instance).data)`, rendered by this thread's instance."""
    return dict(thread_serializer(serializer_class).to_representation(instance))
