"""Admin building blocks shared by every app."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Show rows without letting anyone edit the machinery's state by hand."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """Show a record's child rows on its page, read-only."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
