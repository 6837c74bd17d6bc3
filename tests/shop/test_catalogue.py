"""The French catalogue holds every message the code marks, each translated.

`make messages` (Django's `makemessages`, GNU xgettext) runs on a copy of the
checkout with the Makefile's own ignore list; the catalogue it writes is
compared with the committed one: no message marked in the code or the
templates is missing from it, none is fuzzy or untranslated, none is left over
(docs/storefront.md, "Languages"). The command runs with no server named, and
starts none (runner/manage.py, `SERVERLESS_COMMANDS`).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po
from django.apps import apps

from core.errors import ApplicationError
from runner import manage

ROOT = Path(__file__).resolve().parents[2]
PO = Path("locale") / "fr" / "LC_MESSAGES" / "django.po"
# Not copied: what makemessages never reads and the caches.
NOT_COPIED = (".git", ".venv", "var", "staticfiles", "__pycache__", ".*_cache", "screenshots")


def makefile_ignores() -> list[str]:
    """The `-i` patterns of the Makefile's MESSAGES_IGNORE, so the test extracts as `make` does."""
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"^MESSAGES_IGNORE :=((?:.*\\\n)*.*)$", text, re.M)
    assert block, "the Makefile defines MESSAGES_IGNORE"
    return re.findall(r'-i "([^"]+)"', block[1])


def read_catalogue(path: Path) -> Catalog:
    with path.open("rb") as fh:
        return read_po(fh, locale="fr")


def _key(message) -> tuple:
    ids = message.id if isinstance(message.id, (list, tuple)) else (message.id,)
    return (message.context, *ids)


def unfinished(catalogue: Catalog) -> list[tuple]:
    """The messages a French reader would see in English: fuzzy or without a translation."""
    return [
        _key(m)
        for m in catalogue
        if m.id
        and (m.fuzzy or not m.string or (isinstance(m.string, (list, tuple)) and not all(m.string)))
    ]


def differences(committed: Catalog, extracted: Catalog) -> dict[str, list[tuple]]:
    """What the committed catalogue lacks, keeps without use, or leaves unfinished."""
    have = {_key(m) for m in committed if m.id}
    marked = {_key(m) for m in extracted if m.id}
    return {
        "missing": sorted(marked - have, key=str),
        "left_over": sorted(have - marked, key=str),
        "unfinished": sorted(unfinished(extracted), key=str),
    }


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> tuple[Catalog, subprocess.CompletedProcess, Path]:
    """`manage.py makemessages` on a copy of the checkout, without DATABASE_URL / REDIS_URL."""
    if not shutil.which("xgettext") or not shutil.which("msgmerge"):
        # As the browser tests without Chromium; .ci/run installs it, so CI never skips.
        pytest.skip("needs GNU gettext (xgettext, msgmerge): apt-get install gettext")
    tmp = tmp_path_factory.mktemp("messages")
    copy = tmp / "shop"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*NOT_COPIED))
    env = {
        k: v for k, v in os.environ.items() if k not in (*manage.NAMES, "DJANGO_SETTINGS_MODULE")
    }
    env.update(SHOP_VAR_DIR=str(tmp / "var"), SHOP_ENV_FILE=os.devnull)
    ignores = [arg for pattern in makefile_ignores() for arg in ("-i", pattern)]
    done = subprocess.run(
        [sys.executable, "manage.py", "makemessages", "-l", "fr", "--no-obsolete"]
        + ["--no-location", *ignores],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return read_catalogue(copy / PO), done, tmp / "var"


def test_the_french_catalogue_holds_every_marked_message_translated(extracted):
    catalogue, _, _ = extracted
    found = differences(read_catalogue(ROOT / PO), catalogue)
    assert found == {"missing": [], "left_over": [], "unfinished": []}, (
        "run `make messages`, translate what is missing or fuzzy, and commit the .po and .mo"
    )


def test_makemessages_starts_no_server(extracted):
    _, done, var = extracted
    assert "started the embedded" not in done.stderr
    assert not var.exists()


def test_the_comparison_finds_a_missing_a_fuzzy_and_an_untranslated_message():
    """The wrong twin: a catalogue one message short, one fuzzy, one empty, fails."""
    committed, extracted = Catalog(locale="fr"), Catalog(locale="fr")
    committed.add("Cart", "Panier")
    committed.add("Gone", "Parti")
    extracted.add("Cart", "Panier")
    extracted.add("Checkout", "")
    extracted.add("Total", "Total", flags=["fuzzy"])
    assert differences(committed, extracted) == {
        "missing": [(None, "Checkout"), (None, "Total")],
        "left_over": [(None, "Gone")],
        "unfinished": [(None, "Checkout"), (None, "Total")],
    }


def refusals() -> set[type[ApplicationError]]:
    """Every refusal class of the shop's apps (each app's modules imported first; the test
    support app's refusals are nobody's to read)."""
    for config in apps.get_app_configs():
        path = Path(config.path)
        if not path.is_relative_to(ROOT) or path.is_relative_to(ROOT / "tests"):
            continue
        if "site-packages" in path.parts:  # a virtualenv inside the checkout
            continue
        for module in pkgutil.walk_packages([config.path], f"{config.name}."):
            if ".migrations" not in module.name:
                importlib.import_module(module.name)
    found, todo = set(), [ApplicationError]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if not sub.__module__.startswith("tests."):
                found.add(sub)
    return found


def test_every_refusals_title_has_a_french_translation():
    """The admin and the storefront show `gettext(error.default_title())`: none stays English."""
    catalogue = read_catalogue(ROOT / PO)
    titles = {cls().default_title() for cls in refusals()}
    assert len(titles) > 20
    untranslated = sorted(t for t in titles if not (catalogue.get(t) and catalogue.get(t).string))
    assert untranslated == [], "mark them in core/errors.py, TITLES_FOR_PEOPLE"
