"""A minimal django-oscar 4.2 shop: the bench's second peer (bench/scenarios/oscar.py).

Runs only in its own environment (var/bench-oscar-venv, made from
bench/oscar/requirements.txt), never in the shop's: nothing of the shop
imports it, and it imports nothing of the shop.
"""
