"""The demo data of `make run`: a catalog, one user per role, the shopper's orders.

A development-only app (`manage.py seed_demo`), installed by the development
and test settings and never by production (docs/running.md, "Demo data").
"""
