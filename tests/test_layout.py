"""Imports go one way: config → backoffice → domain apps → idempotency → core.

Read with `ast` from the production modules' source (migrations excluded;
`tests/`, `bench/`, `tools/`, `devtools/` and the test settings are not
production), so an import
inside a function counts as much as one at the top. Imports by dotted string
(`import_string`, settings such as `PAYMENTS_SETTLED_HANDLER`) are not seen:
they are how an inner layer is told about an outer one without importing it.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "docs" / "architecture.md"

CORE = "core"
IDEMPOTENCY = "idempotency"
CONFIG = "config"
# The top app: what staff and operators see across the apps. Like config it may
# import every app (an app's `api/` too: the admin log-in counts in its throttle).
BACKOFFICE = "backoffice"
RUNNER = "runner"
# Not production: development and measuring tools. They have rows in the table too.
TOOLING = ("tools", "bench")
# Not production: the development component (the simulated provider, the demo data).
# The development settings install its demo app; production settings do not.
DEVELOPMENT = "devtools"
# The test settings install the test-support app; they are not production.
NOT_PRODUCTION = {Path("config/settings/test.py")}


def _project_apps() -> list[str]:
    """The project's own apps, from INSTALLED_APPS (a new app cannot be left out)."""
    from django.conf import settings

    tops = {app.split(".")[0] for app in settings.INSTALLED_APPS}
    return sorted(
        top
        for top in tops
        if (ROOT / top / "__init__.py").exists() and top not in ("tests", DEVELOPMENT)
    )


def _graph_table(text: str | None = None) -> dict[str, set[str]]:
    """docs/architecture.md's "Who may import whom": package -> packages it may import."""
    text = TABLE.read_text() if text is None else text
    section = re.split(r"\n#", text.split("### Who may import whom", 1)[1], maxsplit=1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*?) \|$", section, re.M)
    return {name: set(re.findall(r"`(\w+)`", allowed)) for name, allowed in rows}


DOMAIN_APPS = tuple(app for app in _project_apps() if app not in (CORE, IDEMPOTENCY, BACKOFFICE))
PRODUCTION = (CONFIG, *_project_apps(), RUNNER)
# Every top-level package of the repository, so that "a project app" is not
# confused with a third-party module.
PROJECT = (*PRODUCTION, *TOOLING, DEVELOPMENT, "tests")


def _modules(app: str) -> list[Path]:
    paths = sorted(
        path.relative_to(ROOT)
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.relative_to(ROOT).parts
    )
    return [path for path in paths if path not in NOT_PRODUCTION]


def _imported(path: Path, *, with_names: bool = False) -> list[tuple[int, str]]:
    """Every module `path` imports, as absolute dotted names, with its line.

    `with_names`: `from x import a` also yields `x.a` (a submodule, when `a` is one).
    """
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
                module = node.module or ""
            found.append((node.lineno, module))
            if with_names:
                found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
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


def test_the_table_has_a_row_for_every_package_and_no_cycle():
    table = _graph_table()
    assert set(table) == {*PRODUCTION, *TOOLING, DEVELOPMENT}
    assert all(allowed <= set(PROJECT) for allowed in table.values())
    assert _cycles({name: allowed & set(table) for name, allowed in table.items()}) == []


@pytest.mark.parametrize("app", (*PRODUCTION, *TOOLING, DEVELOPMENT))
def test_every_import_is_one_the_table_allows(app):
    allowed = _graph_table()[app]
    wrong = [(where, m) for where, m in _project_imports(app) if _top(m) not in allowed]
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


# Whose `models` may be imported: an app's models are imported by that app's
# own modules only; every other app reads them through its selectors and
# writes them through its services. An import under `if TYPE_CHECKING:` (an
# annotation only) is not a reach-in. Each exception is listed here with why.
REACH_IN_ALLOWED: dict[str, str] = {
    # A foreign key names the model it points at; the schema is the one place
    # where two apps' tables meet, and a string reference would only hide it.
    "orders/models.py -> inventory.models": "orders' foreign keys to Product and Reservation",
    # One statement locks the order's payment row and reads the order with it, in its
    # place of the lock order (docs/checkout.md); a payments function would have to
    # name orders' relation, which payments, the lower layer, must not know.
    "orders/lock_objects.py -> payments.models": "the payment lock joined to its order",
}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """The lines of every statement under `if TYPE_CHECKING:` (annotations only)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _reach_ins(app: str) -> list[tuple[str, str]]:
    found = []
    for path in _modules(app):
        annotations = _type_checking_lines(ast.parse((ROOT / path).read_text()))
        for line, module in _imported(path, with_names=True):
            owner = _top(module)
            if (
                owner in (CORE, IDEMPOTENCY, *DOMAIN_APPS)
                and owner != app
                and module.split(".")[1:2] == ["models"]
                and line not in annotations
                and f"{path.as_posix()} -> {owner}.models" not in REACH_IN_ALLOWED
            ):
                found.append((f"{path}:{line}", f"{owner}.models"))
    return sorted(set(found))


@pytest.mark.parametrize("app", PRODUCTION)
def test_no_module_reads_another_apps_models(app):
    assert _reach_ins(app) == []


def test_every_allowed_reach_in_is_still_there():
    # A stale exception would let the next real reach-in through unseen.
    for entry in REACH_IN_ALLOWED:
        path, owner = entry.split(" -> ")
        modules = {m for _, m in _imported(Path(path), with_names=True)}
        assert any(m == owner or m.startswith(f"{owner}.") for m in modules), entry


def test_the_reach_in_rule_sees_names_and_skips_annotations(tmp_path, monkeypatch):
    app = tmp_path / "shop"
    app.mkdir()
    (app / "cart.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from orders import models\n"
        "from shop.models import CartLine\n"
        "if TYPE_CHECKING:\n"
        "    from inventory.models import Product\n"
        "def f():\n"
        "    from payments.models import Refund\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert [m for _, m in _reach_ins("shop")] == ["orders.models", "payments.models"]


def _module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph(apps) -> dict[str, set[str]]:
    """module -> the production modules it imports (a name imported from a package counts
    as its module when it is one, else as the package)."""
    modules = {_module_name(path) for app in apps for path in _modules(app)}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = defaultdict(set)
    for app in apps:
        for path in _modules(app):
            here = _module_name(path)
            for _, name in _imported(path, with_names=True):
                target = resolve(name)
                # A module importing its own package's __init__ is not a cycle of interest.
                if target and target != here and not here.startswith(f"{target}."):
                    graph[here].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_no_import_cycle_between_production_modules():
    assert _cycles(_module_graph(PRODUCTION)) == []


def test_the_cycle_finder_finds_cycles_lazy_imports_included(tmp_path, monkeypatch):
    pkg = tmp_path / "payments"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "services.py").write_text("from .webhooks import stored\n")
    (pkg / "webhooks.py").write_text("def f():\n    from payments.services import record\n")
    (pkg / "capture.py").write_text("from . import services\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycles(_module_graph(["payments"])) == [["payments.services", "payments.webhooks"]]


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


# --- The development component (devtools/): outside production ----------------


def test_the_development_component_is_no_production_package():
    # Neither an app of production nor a package production's row may name.
    assert (ROOT / DEVELOPMENT / "__init__.py").exists()
    assert DEVELOPMENT not in PRODUCTION and DEVELOPMENT not in DOMAIN_APPS
    table = _graph_table()
    assert [app for app in PRODUCTION if DEVELOPMENT in table[app]] == []


def _development_imports(apps) -> list[tuple[str, str]]:
    return [
        (where, m) for app in apps for where, m in _project_imports(app) if _top(m) == DEVELOPMENT
    ]


def test_no_production_module_imports_the_development_component():
    # Read from the source, imports inside functions included: production runs
    # without the simulator and the demo data (docs/architecture.md).
    assert _development_imports(PRODUCTION) == []


def test_the_development_import_rule_sees_a_late_import(tmp_path, monkeypatch):
    app = tmp_path / "shop"
    app.mkdir()
    (app / "views.py").write_text(
        "def seed():\n    from devtools.demo.seeding import demo_seed\nimport devtools.simulator\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert sorted(m for _, m in _development_imports(["shop"])) == [
        "devtools.demo.seeding",
        "devtools.simulator",
    ]


# --- sizes and names: a module stays readable, a family of files is a package ----------
# (docs/architecture.md, "Layout"; docs/contributing.md).

MAX_MODULE_LINES = 600
# Three files of one folder whose names share a first word (`compensation.py`,
# `compensation_state.py`, `compensation_steps.py`) are a package flattened into names.
PREFIX_FAMILY = 3


def _oversized(apps) -> list[str]:
    """Every production module over MAX_MODULE_LINES, as "<path>: <lines> lines"."""
    found = []
    for app in apps:
        for path in _modules(app):
            lines = len((ROOT / path).read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                found.append(f"{path}: {lines} lines")
    return found


def _prefix_families(apps) -> list[str]:
    """Every folder where PREFIX_FAMILY or more modules share the first word of their
    names (`__init__.py` has none), as "<folder>/<word>_*: <names>"."""
    families: dict[tuple[Path, str], list[str]] = defaultdict(list)
    for app in apps:
        for path in _modules(app):
            word = path.stem.lstrip("_").split("_")[0]
            if path.stem != "__init__" and word:
                families[(path.parent, word)].append(path.name)
    return [
        f"{folder}/{word}_*: {', '.join(sorted(names))}"
        for (folder, word), names in sorted(families.items())
        if len(names) >= PREFIX_FAMILY
    ]


def test_no_production_module_is_over_600_lines():
    assert _oversized(PRODUCTION) == []


def test_no_folder_holds_a_family_of_files_a_package_should_carry():
    assert _prefix_families(PRODUCTION) == []


def test_the_size_rule_finds_a_long_module(tmp_path, monkeypatch):
    app = tmp_path / "core"
    (app / "migrations").mkdir(parents=True)
    (app / "due.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (app / "db.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (app / "migrations" / "0001_initial.py").write_text("x = 1\n" * 2000)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _oversized(["core"]) == [f"core/due.py: {MAX_MODULE_LINES + 1} lines"]


def test_the_family_rule_finds_a_prefix_family_and_passes_a_package(tmp_path, monkeypatch):
    orders = tmp_path / "orders"
    (orders / "compensation").mkdir(parents=True)
    for name in ("__init__", "admin", "admin_forms", "admin_compensation", "models"):
        (orders / f"{name}.py").write_text("")
    for name in ("__init__", "state", "steps", "refund", "_run"):
        (orders / "compensation" / f"{name}.py").write_text("")
    # Two of a word are not yet a family; nor are a package's own modules.
    (orders / "lock_objects.py").write_text("")
    (orders / "lock_rows.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _prefix_families(["orders"]) == [
        "orders/admin_*: admin.py, admin_compensation.py, admin_forms.py"
    ]


# --- config/ wires; patches of third-party code import no app ------------------------

# config/ holds the wiring and nothing else (docs/architecture.md, "Who may import whom").
CONFIG_WIRING = {"__init__.py", "settings", "urls.py", "wsgi.py", "asgi.py", "celery.py"}


def _not_wiring(root: Path) -> list[str]:
    return sorted(
        entry.name
        for entry in (root / CONFIG).iterdir()
        if entry.name not in CONFIG_WIRING
        and entry.name != "__pycache__"
        and (entry.suffix == ".py" or entry.is_dir())
    )


def test_config_holds_wiring_only():
    assert _not_wiring(ROOT) == []


def test_the_wiring_rule_refuses_a_feature_module_in_config(tmp_path):
    config = tmp_path / CONFIG
    (config / "settings").mkdir(parents=True)
    for name in ("__init__.py", "urls.py", "wsgi.py", "asgi.py", "celery.py"):
        (config / name).write_text("")
    assert _not_wiring(tmp_path) == []
    (config / "views.py").write_text("")
    (config / "health").mkdir()
    assert _not_wiring(tmp_path) == ["health", "views.py"]


PATCHES = Path("core/patches")
# What a patch may use of the project: the request's deadline and the database clock.
PATCHES_MAY_IMPORT = {"core.deadline", "core.db"}


def test_patches_of_third_party_code_import_no_app():
    wrong = [
        (f"{path}:{line}", module)
        for path in _modules(CORE)
        if PATCHES in path.parents
        for line, module in _imported(path)
        if _top(module) in PROJECT
        and module not in PATCHES_MAY_IMPORT
        and not module.startswith(f"{PATCHES.as_posix().replace('/', '.')}")
    ]
    assert wrong == []
