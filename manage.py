#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    from django.core.management import execute_from_command_line

    # The same servers as the shop: the environment's or .env's URLs, else the
    # embedded servers of `make run` (started for this command when it is not up).
    from runner.manage import servers_for_command

    with servers_for_command():
        execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
