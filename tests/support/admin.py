"""Admin of the test-only due-work kind: the generic "retry now" action, as any kind gets it."""

from django.contrib import admin

from core.admin import DueWorkAdmin

from .models import DueChore


@admin.register(DueChore)
class DueChoreAdmin(DueWorkAdmin):
    list_display = ("label", *DueWorkAdmin.due_list_display)
