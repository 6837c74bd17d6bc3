"""The run command and the embedded servers (see docs/running.md).

`python -m runner` (what `make run` calls) runs the whole shop under one
supervisor; `runner.embedded` holds PostgreSQL and Redis for a machine with
only Python; `runner.pytest_plugin` gives a test session the same servers;
`runner.manage` gives `manage.py` the servers of `make run`.
Nothing here imports Django or the `config` package (which loads the Celery
app and picks a settings module): this code runs before settings are read.
"""

from __future__ import annotations

import os
from pathlib import Path

from dotenv import dotenv_values

BASE_DIR = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    """Return the folder for local data: `var/` in the checkout, or `SHOP_VAR_DIR`."""
    return Path(os.environ.get("SHOP_VAR_DIR") or BASE_DIR / "var").resolve()


def env_file() -> Path:
    """Return the environment file to read: `SHOP_ENV_FILE`, or `.env` in the checkout."""
    return Path(os.environ.get("SHOP_ENV_FILE") or BASE_DIR / ".env")


def read_env_file(path: Path) -> dict[str, str]:
    """Return the variables of a `.env` file ({} when there is none).

    python-dotenv parses it, with the options the settings use on the same
    file (`config/settings/environment.py`): no `${VAR}` expansion, and a name
    without `=` is no variable. Its syntax: `KEY=value` or `export KEY=value`;
    single quotes take a value as it is, double quotes decode backslash escapes
    (`\\n` is a new line); `#` after a space starts a comment.
    """
    if not Path(path).is_file():
        return {}
    values = dotenv_values(path, interpolate=False, encoding="utf8")
    return {key: value for key, value in values.items() if value is not None}


def load_env_file() -> None:
    """Put the `.env` file's variables into the environment; those already set win."""
    for key, value in read_env_file(env_file()).items():
        os.environ.setdefault(key, value)
