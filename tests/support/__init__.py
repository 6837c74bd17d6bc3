"""Test-only support: the probe operation and its endpoints, the unkeyed twin, server helpers.

Installed as a Django app by the test settings (and the bench's gunicorn
settings) only; production never imports anything from here.
"""
