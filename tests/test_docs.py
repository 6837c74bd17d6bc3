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


# --- names the docs give: each must still exist ------------------------------------

PACKAGES = ("config", "core", "idempotency", "inventory", "orders", "payments", "reports", "shop")
_TEST_REF = re.compile(r"`((?:[\w/]+\.py)?::\w+(?:\[[^\]]*\])?)`")
_DOTTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)`")


def _test_names(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }


def _proved_by_refs(text: str) -> list[tuple[str, str]]:
    """(`tests/` file, test) for every `file::test` and `::test` (the file before it)."""
    refs: list[tuple[str, str]] = []
    for line in text.splitlines():
        current = None
        for ref in _TEST_REF.findall(line):
            path, _, name = ref.partition("::")
            current = path or current
            if current is not None:
                refs.append((current, name.split("[")[0]))
    return refs


def test_every_test_and_function_guarantees_md_names_exists():
    text = (ROOT / "docs" / "guarantees.md").read_text()
    refs = _proved_by_refs(text)
    assert len(refs) > 50  # the parser reads the tables
    missing = []
    for path, name in refs:
        # A test is named from tests/; a row may also name the production code that
        # decides it (`orders/services.py::order_hold`), from the repository's top.
        file = ROOT / "tests" / path
        if not file.exists() and (ROOT / path).exists():
            file = ROOT / path
        if not file.exists():
            missing.append(f"{path} (no such file)")
        elif name not in _test_names(file):
            missing.append(f"{path}::{name}")
    assert missing == []


def _resolves(dotted: str) -> bool:
    import importlib

    from config.celery import app

    app.loader.import_default_modules()  # every app's tasks module, as a worker does
    if dotted in app.tasks:  # a Celery task's name
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                target = getattr(target, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_module_function_and_task_the_glossary_names_exists(db):
    # "Renames" keeps the old names on purpose: only what comes before it is checked.
    text = (ROOT / "docs" / "glossary.md").read_text().split("\n## Renames")[0]
    names = sorted(set(_DOTTED.findall(text)))
    assert len(names) > 30
    assert [name for name in names if not _resolves(name)] == []
