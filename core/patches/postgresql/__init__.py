"""Django's PostgreSQL backend, its pool's wait bounded by the web request's deadline.

The database `ENGINE` (config/settings/servers.py); the backend is in `base.py`.
"""
