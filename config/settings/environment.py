"""Where settings come from: the process environment, filled in from a `.env` file.

Every settings module reads `env` from here, after the file was read, so a
variable set only in `.env` counts wherever it is read.
"""

from pathlib import Path

import environ
from dotenv import load_dotenv

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
# A `.env` file in the checkout (or SHOP_ENV_FILE) fills in what the
# environment does not set; `.env.example` lists the variables. The run
# command, `manage.py` and the test plugin read the same file, with the same
# parser and options, before they decide which servers to embed
# (runner.read_env_file): python-dotenv, no `${VAR}` expansion.
load_dotenv(
    env.str("SHOP_ENV_FILE", default="") or BASE_DIR / ".env",
    override=False,
    interpolate=False,
    encoding="utf8",
)
