"""One version everywhere: pyproject.toml's [project], the OpenAPI document, the CHANGELOG."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.django_db
def test_the_openapi_document_shows_the_project_version(api_client):
    schema = api_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert schema.json()["info"]["version"] == _version()


def test_the_changelog_names_the_version_its_unreleased_section_becomes():
    text = (ROOT / "CHANGELOG.md").read_text()
    unreleased = re.search(r"^## \[Unreleased\] \((\d+\.\d+\.\d+)\)$", text, re.M)
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert unreleased, "CHANGELOG.md: '## [Unreleased] (X.Y.Z)' names the next version"
    version = _version()
    assert re.sub(r"\.dev\d+$", "", version) == unreleased.group(1)
    assert unreleased.group(1) not in released  # not a version already released

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(part) for part in v.split("."))

    assert key(unreleased.group(1)) > max(key(v) for v in released)
