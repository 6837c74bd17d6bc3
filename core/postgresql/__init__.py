"""Django's PostgreSQL backend, its pool's wait bounded by the web request's deadline."""
