"""Payments: the gateway to the provider, captures, settlement (arrives with its issue)."""
