"""`make lint` and the pre-commit hooks fail on a model change without its migration.

The migration check is the Makefile's own line, run here as `make lint` runs it
(docs/testing.md, "Lint checks"); its twin adds a model without a migration
(a scratch app in a temporary folder) and must see the check fail.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MIGRATIONS_CHECK = "$(BIN)/python manage.py makemigrations --check --dry-run"


def _recipe(target: str) -> list[str]:
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_make_lint_checks_migrations_after_ruff_and_before_mypy():
    recipe = _recipe("lint")
    assert recipe == [
        "$(BIN)/ruff check .",
        "$(BIN)/ruff format --check .",
        MIGRATIONS_CHECK,
        "$(BIN)/mypy",
    ]


def _migrations_check(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    command = MIGRATIONS_CHECK.replace("$(BIN)", str(Path(sys.executable).parent))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(SHOP_ENV_FILE=os.devnull, SHOP_VAR_DIR=str(tmp_path / "var"), **extra)
    return subprocess.run(
        shlex.split(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_migrations_check_passes_on_the_checkout(tmp_path):
    out = _migrations_check(tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "No changes detected" in out.stdout


def test_the_migrations_check_fails_on_a_model_without_its_migration(tmp_path):
    """The twin: an app whose model has no migration makes the same command fail."""
    app = tmp_path / "scratch"
    (app / "migrations").mkdir(parents=True)
    (app / "__init__.py").write_text("")
    (app / "migrations" / "__init__.py").write_text("")
    (app / "models.py").write_text(
        "from django.db import models\n\n\n"
        "class Thing(models.Model):\n"
        "    name = models.CharField(max_length=10)\n"
    )
    (tmp_path / "scratch_settings.py").write_text(
        "from config.settings.base import *  # noqa: F403\n"
        "from config.settings.base import INSTALLED_APPS\n\n"
        'INSTALLED_APPS = [*INSTALLED_APPS, "scratch"]\n'
    )
    out = _migrations_check(
        tmp_path, DJANGO_SETTINGS_MODULE="scratch_settings", PYTHONPATH=str(tmp_path)
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Migrations for 'scratch'" in out.stdout, out.stdout


def test_pre_commit_runs_ruff_ruff_format_and_the_migrations_check_from_the_venv():
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    (repo,) = config["repos"]
    assert repo["repo"] == "local"
    hooks = {hook["id"]: hook for hook in repo["hooks"]}
    assert list(hooks) == ["ruff", "ruff-format", "makemigrations"]
    assert all(hook["language"] == "system" for hook in hooks.values())
    assert hooks["ruff"]["entry"].startswith(".venv/bin/ruff check")
    assert hooks["ruff-format"]["entry"].startswith(".venv/bin/ruff format")
    # The Makefile's command with its $(BIN), the virtualenv `make venv` makes.
    assert hooks["makemigrations"]["entry"] == MIGRATIONS_CHECK.replace("$(BIN)", ".venv/bin")
    assert hooks["makemigrations"]["pass_filenames"] is False
    assert _make_variable("VENV") == ".venv"


def _make_variable(name: str) -> str:
    for line in (ROOT / "Makefile").read_text().splitlines():
        left, sep, value = line.partition("?=")
        if sep and left.strip() == name:
            return value.strip()
    raise AssertionError(f"{name} is not set in the Makefile")
