"""Settings of the bench harness process itself (not of the gunicorn it loads).

The harness migrates and seeds the bench database and mints bench users with
the real services. It installs what gunicorn installs
(`bench.gunicorn_settings`: the base settings plus the test-only probe and
unkeyed twin and the bench-only peer); only one thing differs: bench
users' passwords are hashed with a fast hasher, so minting dozens of them
takes milliseconds, not PBKDF2's ~0.5 s each. Gunicorn runs the unchanged
base settings, which do not accept that hasher: bench users authenticate with
their tokens only.
"""

from bench.gunicorn_settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
