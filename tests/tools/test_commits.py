"""tools/commits.py checks commit messages as docs/contributing.md, "Commits", asks."""

from __future__ import annotations

import subprocess

from tools.commits import main, problems

GOOD = "Refuse couriers on the storefront's changing pages\n\nA courier token reached\nthe cart.\n"


def test_a_message_that_keeps_the_rules_passes():
    assert problems(GOOD) == []
    assert problems("Embed the reference in the run\n\nWhy: the ratios.") == []


def test_each_broken_rule_is_named():
    assert problems("x" * 73 + "\n\nbody") == [
        "subject is 73 characters (at most 72)",
        "subject does not start with a capital letter",
    ]
    assert problems("Added the relay.\n\nbody") == [
        "subject ends with a period",
        "subject is not in the imperative ('Added')",
    ]
    assert problems("Fix the relay\nbody at once") == [
        "no blank line after the subject",
        "no body: the body tells what and why",
    ]
    assert problems("Fix the relay\n") == ["no body: the body tells what and why"]


def test_the_commits_of_a_range_are_read_from_git(tmp_path, monkeypatch, capsys):
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    git("commit", "-q", "--allow-empty", "-m", "Start the history", "-m", "The base.")
    git("commit", "-q", "--allow-empty", "-m", "Fixed everything and much more besides " * 3)
    monkeypatch.chdir(tmp_path)
    assert main(["HEAD~1..HEAD"]) == 1
    out = capsys.readouterr().out
    assert "subject is 116 characters" in out and "no body" in out
    assert main(["-1", "HEAD~1"]) == 0
