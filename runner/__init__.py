"""The run command and the embedded servers (see docs/running.md).

`python -m runner` (what `make run` calls) runs the whole shop under one
supervisor; `runner.embedded` holds PostgreSQL and Redis for a machine with
only Python; `runner.pytest_plugin` gives a test session the same servers.
Nothing here imports Django or the `config` package (which loads the Celery
app and picks a settings module): this code runs before settings are read.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    """Return the folder for local data: `var/` in the checkout, or `SHOP_VAR_DIR`."""
    return Path(os.environ.get("SHOP_VAR_DIR") or BASE_DIR / "var").resolve()
