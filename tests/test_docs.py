"""The docs describe today's code: no stale promises (docs/testing.md, "Checked docs").

A doc or docstring that says something is "not built yet", comes in a
"later issue" or "arrives with" one goes stale the day it is built; the
present tense is checked instead, here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STALE = re.compile(r"not built yet|later issue|arrives with", re.IGNORECASE)


def _tracked(*patterns: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_no_doc_or_docstring_promises_something_for_later():
    files = [p for p in _tracked("*.md", "*.py") if not p.startswith("tests/")]
    found = [
        f"{path}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate((ROOT / path).read_text().splitlines(), 1)
        if STALE.search(line)
    ]
    assert found == []
