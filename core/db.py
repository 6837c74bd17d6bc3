"""Small database helpers shared by every app."""

from __future__ import annotations

from django.db import IntegrityError


def violated_constraint(exc: IntegrityError) -> str | None:
    """Return the name of the constraint an IntegrityError violated, if PostgreSQL named one."""
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)
