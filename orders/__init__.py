"""Orders: lines, state machine, events (checkout arrives with its issue)."""
