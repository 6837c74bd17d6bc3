"""Shared machinery that imports no domain app.

Errors and problem responses, pagination, roles, request keys, the outbox and
the inbox, failpoints and duplicate counters.
"""
