"""Payments: the gateway to the provider, captures, settlement of lost answers, reconciliation."""
