"""The back office: what staff and operators see across every app.

The admin's index and its "Needs attention" page, the throttled admin
log-in, the health checks, `/metrics`, error reporting and the one
permission map. The top of the import table (docs/architecture.md): it may
import every app, and no app imports it. Imports nothing at package level:
gunicorn's master loads `backoffice.prometheus_multiproc` before Django.
"""
