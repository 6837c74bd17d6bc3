"""Imports go one way: config → domain apps → idempotency → core (docs/architecture.md).

Read with `ast` from the production modules' source (migrations excluded;
`tests/`, `bench/` and the test settings are not production), so an import
inside a function counts as much as one at the top. Imports by dotted string
(`import_string`, settings such as `PAYMENTS_SETTLED_HANDLER`) are not seen:
they are how an inner layer is told about an outer one without importing it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CORE = "core"
IDEMPOTENCY = "idempotency"
CONFIG = "config"
DOMAIN_APPS = ("shop", "orders", "inventory", "payments")
RUNNER = "runner"
PRODUCTION = (CONFIG, *DOMAIN_APPS, IDEMPOTENCY, CORE, RUNNER)
# Every top-level package of the repository, so that "a project app" is not
# confused with a third-party module.
PROJECT = (*PRODUCTION, "tests", "bench")
# The test settings install the test-support app; they are not production.
NOT_PRODUCTION = {Path("config/settings/test.py")}


def _modules(app: str) -> list[Path]:
    paths = sorted(
        path.relative_to(ROOT)
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
    )
    return [path for path in paths if path not in NOT_PRODUCTION]


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module `path` imports, as absolute dotted names, with its line."""
    package = list(path.parent.parts)
    found = []
    for node in ast.walk(ast.parse((ROOT / path).read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
                if not node.module:  # `from . import x`: the names are modules too
                    found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
                    continue
            else:
                module = node.module
            found.append((node.lineno, module))
    return found


def _project_imports(app: str) -> list[tuple[str, str]]:
    """(where, module) for every import of another project package by `app`."""
    return [
        (f"{path}:{line}", module)
        for path in _modules(app)
        for line, module in _imported(path)
        if module.split(".")[0] in PROJECT and module.split(".")[0] != app
    ]


def _top(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("app", PRODUCTION)
def test_every_app_has_modules_to_check(app):
    # The rules below pass vacuously if the walk finds nothing.
    assert _modules(app), f"no production module found under {app}/"


def test_core_imports_no_project_app():
    assert _project_imports(CORE) == []


def test_idempotency_imports_only_core():
    wrong = [(where, m) for where, m in _project_imports(IDEMPOTENCY) if _top(m) != CORE]
    assert wrong == []


@pytest.mark.parametrize("app", DOMAIN_APPS)
def test_domain_apps_import_neither_config_nor_tests(app):
    wrong = [
        (where, m) for where, m in _project_imports(app) if _top(m) in (CONFIG, "tests", "bench")
    ]
    assert wrong == []


@pytest.mark.parametrize("app", DOMAIN_APPS)
def test_domain_apps_never_import_another_apps_api(app):
    # An app's `api/` package is its HTTP surface; others call its services
    # and selectors instead.
    wrong = [
        (where, m)
        for where, m in _project_imports(app)
        if _top(m) in DOMAIN_APPS and m.split(".")[1:2] == ["api"]
    ]
    assert wrong == []


@pytest.mark.parametrize("app", ("payments", "inventory"))
def test_payments_and_inventory_import_no_other_domain_app(app):
    # Payments tells orders about an outcome through PAYMENTS_SETTLED_HANDLER
    # (a dotted path), never by importing it; inventory is below both.
    wrong = [(where, m) for where, m in _project_imports(app) if _top(m) in DOMAIN_APPS]
    assert wrong == []


@pytest.mark.parametrize("app", (CORE, IDEMPOTENCY, *DOMAIN_APPS))
def test_inner_layers_never_import_config(app):
    wrong = [(where, m) for where, m in _project_imports(app) if _top(m) == CONFIG]
    assert wrong == []


@pytest.mark.parametrize("app", PRODUCTION)
def test_production_never_imports_test_code(app):
    wrong = [(where, m) for where, m in _project_imports(app) if _top(m) in ("tests", "bench")]
    assert wrong == []


def test_the_runner_imports_no_django_and_no_app():
    # The supervisor and the embedded servers run before (and without) Django.
    wrong = [
        (f"{path}:{line}", module)
        for path in _modules(RUNNER)
        for line, module in _imported(path)
        if _top(module) in (*PROJECT, "django", "rest_framework", "celery")
        and _top(module) != RUNNER
    ]
    assert wrong == []


def test_the_reader_sees_relative_and_late_imports(tmp_path, monkeypatch):
    # The rules are only as good as the reader: relative imports resolve to
    # absolute names, and an import inside a function is seen.
    app = tmp_path / "payments"
    app.mkdir()
    (app / "mod.py").write_text(
        "from . import models\n"
        "from .api.serializers import X\n"
        "from ..orders import services\n"
        "def f():\n"
        "    import config.celery\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [m for _, m in _imported(Path("payments/mod.py"))] == [
        "payments.models",
        "payments.api.serializers",
        "orders",
        "config.celery",
    ]
    assert [m for _, m in _project_imports("payments")] == ["orders", "config.celery"]
