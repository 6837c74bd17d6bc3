"""Environment variables that were renamed: the new name wins, the old one still works.

A deployment's environment (or `.env`) outlives a release, so a renamed
variable is read under its old name for one release, with a warning that
says which name to set instead (docs/configuration.md, "Renamed variables").
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("config.settings")

# Old names already warned about in this process: one warning each, however
# often the settings ask.
_warned: set[str] = set()


def renamed(new: str, *, old: str) -> str:
    """The variable to read: `new`, or `old` when only the old name is set (warned once)."""
    if old not in os.environ:
        return new
    if old not in _warned:
        _warned.add(old)
        if new in os.environ:
            logger.warning("%s is deprecated and ignored: %s is set", old, new)
        else:
            logger.warning("%s is deprecated: read as %s; set %s instead", old, new, new)
    return new if new in os.environ else old
