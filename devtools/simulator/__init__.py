"""The simulated payment provider, run as its own process (`python -m devtools.simulator`).

It stands for an external system: it imports nothing from Django or the shop
and keeps its ledger in its own SQLite file.
"""
