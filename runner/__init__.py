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
import re
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


def var_dir() -> Path:
    """Return the folder for local data: `var/` in the checkout, or `SHOP_VAR_DIR`."""
    return Path(os.environ.get("SHOP_VAR_DIR") or BASE_DIR / "var").resolve()


def env_file() -> Path:
    """Return the environment file to read: `SHOP_ENV_FILE`, or `.env` in the checkout."""
    return Path(os.environ.get("SHOP_ENV_FILE") or BASE_DIR / ".env")


_LINE = re.compile(r"\A(?:export )?([A-Za-z_0-9]+)=(.*)\Z")


def read_env_file(path: Path) -> dict[str, str]:
    """Return the variables of a `.env` file ({} when there is none).

    The syntax and quoting are those of django-environ's `Env.read_env`
    (which the settings use on the same file; django-environ imports Django,
    so it cannot be used here): `KEY=value` or `export KEY=value`, one per
    line, no spaces around `=`; a value in single quotes is taken as it is,
    one in double quotes has its backslash escapes removed except \\n \\r \\t;
    lines starting with `#` and blank lines are skipped.
    """
    try:
        content = Path(path).read_text(encoding="utf8")
    except OSError:
        return {}
    found: dict[str, str] = {}
    for line in content.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        key, value = match.groups()
        if single := re.match(r"\A'(.*)'\Z", value):
            value = single.group(1)
        if double := re.match(r'\A"(.*)"\Z', value):
            value = re.sub(
                r"\\(.)",
                lambda m: "\\" + m.group(1) if m.group(1) in "rnt" else m.group(1),
                double.group(1),
            )
        found[key] = value
    return found


def load_env_file() -> None:
    """Put the `.env` file's variables into the environment; those already set win."""
    for key, value in read_env_file(env_file()).items():
        os.environ.setdefault(key, value)
