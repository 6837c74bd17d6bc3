"""Admin building blocks shared by every app."""

from typing import Any, ClassVar

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.utils.translation import gettext, gettext_lazy


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

    def has_change_state_permission(self, request, obj=None) -> bool:
        """The model's own `change` permission: what every action and button here requires.

        The edit form stays refused to everyone (`has_change_permission`);
        rows change only through a service, and an action, button or custom
        view that calls one checks this (`@admin.action(permissions=["change_state"])`,
        or `require_permission` in a view): a staff user who may only view is refused.
        """
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")

    def changelist_view(self, request, extra_context=None):
        """A posted action this user is not offered is 403, not Django's silent "no action".

        The changelist hides an action whose `permissions=` the user lacks; a
        forced POST of it (another tab, a script) is refused the same way a
        custom view is, and nothing changes (contract: "Staff in the admin").
        """
        name = request.POST.get("action") if request.method == "POST" else None
        if name and name not in self.get_actions(request):
            declared = {a if isinstance(a, str) else a.__name__ for a in self.actions or ()}
            if name in declared or name in {site_name for site_name, _ in self.admin_site.actions}:
                raise PermissionDenied
        return super().changelist_view(request, extra_context)


def require_permission(allowed: bool) -> None:
    """Refuse a custom admin view (403) unless `allowed` (a `has_..._permission` answer)."""
    if not allowed:
        raise PermissionDenied


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

    @admin.action(
        description=gettext_lazy("Retry now (fresh attempt budget)"), permissions=["change_state"]
    )
    def retry_now(self, request, queryset):
        from django.db import transaction

        with transaction.atomic():
            reopened = sum(
                bool(self.retry_one(request, pk)) for pk in queryset.values_list("pk", flat=True)
            )
        messages.success(request, gettext("{count} scheduled now.").format(count=reopened))
