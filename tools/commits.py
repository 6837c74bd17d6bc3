"""Check commit messages against docs/contributing.md, "Commits".

    .venv/bin/python -m tools.commits main..HEAD     # every commit of a branch
    .venv/bin/python -m tools.commits -1             # the last commit

The subject says what the commit does in at most 72 characters, in the
imperative (a capital letter, no period at the end, not "Added"/"Fixes"), and a
blank line parts it from the body, which tells the story. Merge commits are
not checked. Exit status 1 lists each commit and what it breaks.
"""

from __future__ import annotations

import re
import subprocess
import sys

MAX_SUBJECT = 72
# First words that narrate or describe instead of commanding: "Added", "Fixes", "Fixing".
_NOT_IMPERATIVE = re.compile(r"^[A-Z][a-z]+(?:ed|es|ing)$")
# Imperative verbs those endings would catch.
_IMPERATIVE = {"Embed", "Feed", "Need", "Seed", "Shed", "Speed", "Bring", "Ring", "String"}


def problems(message: str) -> list[str]:
    """What in one commit message breaks the rules (an empty list: none)."""
    lines = message.rstrip("\n").split("\n")
    subject = lines[0]
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"subject is {len(subject)} characters (at most {MAX_SUBJECT})")
    if not subject[:1].isupper():
        found.append("subject does not start with a capital letter")
    if subject.endswith("."):
        found.append("subject ends with a period")
    first = subject.split(" ", 1)[0]
    if _NOT_IMPERATIVE.match(first) and first not in _IMPERATIVE:
        found.append(f"subject is not in the imperative ({first!r})")
    if len(lines) > 1 and lines[1].strip():
        found.append("no blank line after the subject")
    if not any(line.strip() for line in lines[2:]):
        found.append("no body: the body tells what and why")
    return found


def _messages(revisions: list[str]) -> list[tuple[str, str]]:
    out = subprocess.run(
        ["git", "log", "--no-merges", "--format=%h%x00%B%x1e", *revisions],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    entries = [entry.strip("\n") for entry in out.split("\x1e") if entry.strip()]
    return [(sha, message) for sha, message in (entry.split("\x00", 1) for entry in entries)]


def main(argv: list[str] | None = None) -> int:
    revisions = sys.argv[1:] if argv is None else argv
    failed = 0
    for sha, message in _messages(revisions or ["-1"]):
        for problem in problems(message):
            failed += 1
            print(f"{sha} {message.splitlines()[0][:60]!r}: {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
