#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys

PRODUCTION_SETTINGS = "config.settings.production"


def settings_module(argv: list[str], environ: dict[str, str] | os._Environ) -> str:
    """Return the settings module the command will load (`--settings` wins, as in Django)."""
    for index, arg in enumerate(argv):
        if arg.startswith("--settings="):
            return arg.split("=", 1)[1]
        if arg == "--settings" and index + 1 < len(argv):
            return argv[index + 1]
    return environ.get("DJANGO_SETTINGS_MODULE", "config.settings.base")


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    from django.core.management import execute_from_command_line

    if settings_module(sys.argv, os.environ) == PRODUCTION_SETTINGS:
        # Production names its servers in the environment, or fails naming what is
        # missing (config/settings/production.py): never an embedded server in var/.
        execute_from_command_line(sys.argv)
        return
    # The same servers as the shop: the environment's or .env's URLs, else the
    # embedded servers of `make run` (started for this command when it is not up).
    # The runner is development tooling (requirements/dev.txt): a host without it
    # is told which settings it runs (docs/deployment.md, "A production host:
    # requirements.txt only") instead of falling back to development settings.
    try:
        from runner.manage import servers_for_command
    except ModuleNotFoundError as missing:
        raise SystemExit(
            f"manage.py: {missing}: the development settings need the development "
            "packages (make venv: requirements/dev.txt). A production host sets "
            f"DJANGO_SETTINGS_MODULE={PRODUCTION_SETTINGS} (deploy/shop.env.example)."
        ) from None

    with servers_for_command(sys.argv):
        execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
