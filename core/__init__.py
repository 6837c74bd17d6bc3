"""What every app needs and no domain owns.

Errors and problem rendering, pagination, money, roles and database helpers.
Imports no other app of the project (docs/architecture.md).
"""
