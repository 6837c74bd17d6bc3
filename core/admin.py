"""Admin building blocks shared by every app."""

from typing import Any, ClassVar

from django.contrib import admin, messages


class ReadOnlyAdmin(admin.ModelAdmin):
    """Show rows without letting anyone edit the machinery's state by hand."""

    # Subclasses list flat field names and reuse the list as readonly_fields,
    # which the stubs' `fields` type (field groups) cannot be assigned to.
    fields: ClassVar[Any]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """Show a record's child rows on its page, read-only."""

    fields: ClassVar[Any]  # as ReadOnlyAdmin's

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class DueWorkAdmin(ReadOnlyAdmin):
    """Read-only admin of a due-work model (`core.due.DueWork`) with the one "retry now" action.

    The action gives each selected row a fresh attempt budget, due now, and
    rings its bell after commit. A kind that must also record the retry in
    its own history (an event row) overrides `retry_one`.
    """

    due_list_display = (
        "attempts",
        "next_attempt_at",
        "needs_attention",
        "lease_expires_at",
        "done_at",
        "last_error",
    )
    # Wide enough for the subclasses' lists that extend it.
    list_filter: ClassVar[list[Any] | tuple[Any, ...]] = (
        "needs_attention",
        ("done_at", admin.EmptyFieldListFilter),
    )
    actions = ["retry_now"]

    def retry_one(self, request, pk) -> bool:
        """Retry one row; return True if it was reopened (done rows stay done)."""
        from . import due

        return due.retry_now(self.model, pk=pk)

    @admin.action(description="Retry now (fresh attempt budget)")
    def retry_now(self, request, queryset):
        from django.db import transaction

        with transaction.atomic():
            reopened = sum(
                bool(self.retry_one(request, pk)) for pk in queryset.values_list("pk", flat=True)
            )
        messages.success(request, f"{reopened} scheduled now.")
