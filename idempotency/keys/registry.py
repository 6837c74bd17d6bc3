"""Register how the completer resumes each keyed operation."""

from __future__ import annotations

from collections.abc import Callable

from .run import KeyRun

_registry: dict[str, Callable[[KeyRun], None]] = {}


def register_operation(name: str, *, resume: Callable[[KeyRun], None]) -> None:
    """Register how the completer drives an abandoned key of operation `name` to its end.

    `resume(run)` gets a leased KeyRun at the key's recovery point and must
    finish it (drive forward or roll back, then `run.finish(...)`), leave it
    open, or `run.abandon()` it when no phase has committed.
    """
    existing = _registry.get(name)
    if existing is not None and existing is not resume:
        raise ValueError(f"operation {name!r} is already registered")
    _registry[name] = resume


def registered_operations() -> dict[str, Callable[[KeyRun], None]]:
    return dict(_registry)
