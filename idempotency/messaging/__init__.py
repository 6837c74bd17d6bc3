"""Messaging: events written with the business change and handed to their consumers once.

`outbox` writes an event in the caller's transaction; `relay` fans each
outbox row out to one delivery per registered consumer and rings it;
`deliveries` runs a consumer's deliveries (attempts, dead letters, requeue);
`inbox` records a message received from outside once (docs/events.md).
Callers import the module they use (`from idempotency.messaging import relay`).
"""
