"""Development components: the simulated payment provider and the demo data.

Neither is production code: `config/settings/production.py` installs neither
and no production module imports them (tests/test_layout.py). The simulator
stands in for the provider in development, tests, bench and chaos runs
(`python -m devtools.simulator`); the demo app seeds `make run`'s database
(`manage.py seed_demo`). docs/running.md.
"""
