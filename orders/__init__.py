"""Orders: lines, state machine, events and the keyed checkout."""
