"""Fixtures of the development component's tests: a simulator process."""

from tests.payments.conftest import simulator  # noqa: F401 (a `python -m devtools.simulator`)
